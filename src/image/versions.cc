// The versions of the codec libraries kiln::image was compiled against,
// recorded in every cache's manifest.
#include <jconfig.h>

#include <opencv2/core/version.hpp>

#include "kiln/image/decode.h"

#define KILN_STR_INNER(x) #x
#define KILN_STR(x) KILN_STR_INNER(x)

namespace kiln::image {

std::vector<std::pair<std::string, std::string>> CodecVersions() {
  return {{"libjpeg-turbo", KILN_STR(LIBJPEG_TURBO_VERSION)}, {"opencv", CV_VERSION}};
}

}  // namespace kiln::image
