#include "core/jpeg_codec.h"

// jpeglib.h needs size_t and FILE declared before it.
#include <cstdio>
#include <csetjmp>
#include <cstdlib>
#include <cstring>

#include <jpeglib.h>

#include <algorithm>

namespace kiln::internal {

namespace {

// libjpeg reports errors through error_exit, which must not return: it
// longjmps back to the call that set `jump`. The message is kept for the
// Status. A warning (damaged data libjpeg would decode around: a truncated
// file, extraneous bytes) is an error too, as TurboJPEG's
// TJFLAG_STOPONWARNING makes it for source files.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void EmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) ErrorExit(cinfo);  // a warning: the data are damaged
}

void InitErrors(ErrorManager* err) {
  jpeg_std_error(&err->pub);
  err->pub.error_exit = ErrorExit;
  err->pub.emit_message = EmitMessage;
  err->message[0] = '\0';
}

Status Damaged(const char* what, const char* reason) {
  return Status::Corruption(std::string(what) + ": " + reason);
}

}  // namespace

bool IsJpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

struct Decoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  std::vector<JSAMPROW> rows;
  bool created = false;
};

Decoder::Decoder() : state_(new State) {
  InitErrors(&state_->err);
  state_->cinfo.err = &state_->err.pub;
  // jpeg_create_decompress reports failure (out of memory) by error_exit.
  if (setjmp(state_->err.jump) == 0) {
    jpeg_create_decompress(&state_->cinfo);
    state_->created = true;
  }
}

Decoder::~Decoder() {
  if (state_->created) jpeg_destroy_decompress(&state_->cinfo);
}

namespace {

// The body of Decoder::Decode between setjmp and the return: only plain
// data live here, so a longjmp out of libjpeg skips no destructor.
// Returns 0, or 1 with err->message set, or 2 when the components do not
// match `channels` (`reason` set).
int DecodeInto(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data, size_t size,
               int image_w, int image_h, int channels, int scale, int left, int top, int w, int h,
               JpegRegion* out, std::vector<JSAMPROW>* rows, const char** reason) {
  if (setjmp(err->jump) != 0) {
    jpeg_abort_decompress(cinfo);
    return 1;
  }
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  if (static_cast<int>(cinfo->image_width) != image_w ||
      static_cast<int>(cinfo->image_height) != image_h) {
    std::snprintf(err->message, sizeof(err->message),
                  "the JPEG is %ux%u (width x height), its record says %dx%d", cinfo->image_width,
                  cinfo->image_height, image_w, image_h);
    *reason = err->message;
    jpeg_abort_decompress(cinfo);
    return 2;
  }
  if (channels == 1) {
    if (cinfo->jpeg_color_space != JCS_GRAYSCALE) {
      *reason = "a colour JPEG where a one-channel image belongs";
      jpeg_abort_decompress(cinfo);
      return 2;
    }
    cinfo->out_color_space = JCS_GRAYSCALE;
  } else {
    if (cinfo->num_components == 4 || cinfo->jpeg_color_space == JCS_CMYK ||
        cinfo->jpeg_color_space == JCS_YCCK) {
      *reason = "a CMYK JPEG where an RGB image belongs";
      jpeg_abort_decompress(cinfo);
      return 2;
    }
    cinfo->out_color_space = JCS_RGB;
  }
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(scale);
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  jpeg_start_decompress(cinfo);
  const int full_w = static_cast<int>(cinfo->output_width);
  const int full_h = static_cast<int>(cinfo->output_height);
  // The box, one pixel wider on each side, clamped to the image.
  int x0 = 0, x1 = full_w, y0 = 0, y1 = full_h;
  if (w > 0 && h > 0) {
    x0 = std::max(0, std::min(left, full_w) - 1);
    x1 = std::min(full_w, std::max(left + w, 0) + 1);
    y0 = std::max(0, std::min(top, full_h) - 1);
    y1 = std::min(full_h, std::max(top + h, 0) + 1);
    if (x1 <= x0) x1 = std::min(full_w, x0 + 1);
    if (y1 <= y0) y1 = std::min(full_h, y0 + 1);
  }
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (x0 > 0 || x1 < full_w) jpeg_crop_scanline(cinfo, &xoff, &cw);  // xoff moves to an iMCU
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  out->x0 = static_cast<int>(xoff);
  out->width = static_cast<int>(cinfo->output_width);
  out->y0 = y0;
  out->height = y1 - y0;
  out->channels = channels;
  const size_t row = static_cast<size_t>(out->width) * channels;
  out->pixels.resize(row * out->height);
  rows->resize(static_cast<size_t>(out->height));
  for (int y = 0; y < out->height; ++y) (*rows)[y] = out->pixels.data() + row * y;
  int done = 0;
  while (done < out->height) {
    const JDIMENSION got = jpeg_read_scanlines(
        cinfo, rows->data() + done, static_cast<JDIMENSION>(out->height - done));
    if (got == 0) {  // a suspending source never runs dry; this is damage
      std::snprintf(err->message, sizeof(err->message), "no more rows after %d", y0 + done);
      jpeg_abort_decompress(cinfo);
      return 1;
    }
    done += static_cast<int>(got);
  }
  // Rows past the box are not needed; a whole image is read to its end, so
  // that damage after the last row (a truncated file) is reported too.
  if (cinfo->output_scanline < cinfo->output_height) {
    jpeg_abort_decompress(cinfo);
  } else {
    jpeg_finish_decompress(cinfo);
  }
  return 0;
}

}  // namespace

Status Decoder::Decode(const uint8_t* data, size_t size, int image_w, int image_h, int channels,
                       int scale, int left, int top, int w, int h, JpegRegion* out) {
  if (!state_->created) return Status::IOError("cannot create a JPEG decompressor (out of memory)");
  if (!IsJpeg(data, size)) return Status::Corruption("not JPEG data (no SOI marker)");
  if (size > static_cast<size_t>(~0ul)) return Status::Corruption("JPEG data too large");
  if (scale != 1 && scale != 2 && scale != 4 && scale != 8)
    return Status::InvalidArgument("JPEG DCT scale " + std::to_string(scale) +
                                   " is not 1, 2, 4 or 8");
  const char* reason = nullptr;
  const int r = DecodeInto(&state_->cinfo, &state_->err, data, size, image_w, image_h, channels,
                           scale, left, top, w, h, out, &state_->rows, &reason);
  if (r == 1) return Damaged("damaged JPEG", state_->err.message);
  if (r == 2) return Status::Corruption(reason);
  return Status::OK();
}

namespace {

int ReadInfoInto(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data,
                 size_t size, JpegInfo* info) {
  if (setjmp(err->jump) != 0) return 1;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  info->width = static_cast<int>(cinfo->image_width);
  info->height = static_cast<int>(cinfo->image_height);
  info->components = cinfo->num_components;
  return 0;
}

int EncodeInto(jpeg_compress_struct* cinfo, ErrorManager* err, const uint8_t* pixels, int width,
               int height, int channels, int quality, unsigned char** buf, unsigned long* len) {
  if (setjmp(err->jump) != 0) return 1;
  jpeg_mem_dest(cinfo, buf, len);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  cinfo->input_components = channels;
  cinfo->in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(cinfo);
  jpeg_set_quality(cinfo, quality, TRUE);
  cinfo->dct_method = JDCT_ISLOW;
  jpeg_start_compress(cinfo, TRUE);
  const size_t row = static_cast<size_t>(width) * channels;
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW r = const_cast<JSAMPROW>(pixels + row * cinfo->next_scanline);
    jpeg_write_scanlines(cinfo, &r, 1);
  }
  jpeg_finish_compress(cinfo);
  return 0;
}

}  // namespace

Status ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info) {
  if (!IsJpeg(data, size)) return Status::Corruption("not JPEG data (no SOI marker)");
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  InitErrors(&err);
  cinfo.err = &err.pub;
  if (setjmp(err.jump) != 0) return Status::IOError("cannot create a JPEG decompressor");
  jpeg_create_decompress(&cinfo);
  const int r = ReadInfoInto(&cinfo, &err, data, size, info);
  jpeg_destroy_decompress(&cinfo);
  if (r != 0) return Damaged("unreadable JPEG header", err.message);
  if (info->width <= 0 || info->height <= 0)
    return Status::Corruption("JPEG header gives an empty image");
  return Status::OK();
}

Status EncodeJpeg(const uint8_t* pixels, int width, int height, int channels, int quality,
                  std::vector<uint8_t>* out) {
  if (channels != 1 && channels != 3)
    return Status::InvalidArgument("JPEG encoding takes 1 or 3 channels, not " +
                                   std::to_string(channels));
  if (quality < 1 || quality > 100)
    return Status::InvalidArgument("JPEG quality " + std::to_string(quality) +
                                   " outside 1..100");
  if (width < 1 || height < 1 || width > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION)
    return Status::InvalidArgument("a " + std::to_string(width) + "x" + std::to_string(height) +
                                   " image cannot be a JPEG (1..65500 pixels a side)");
  jpeg_compress_struct cinfo;
  ErrorManager err;
  InitErrors(&err);
  cinfo.err = &err.pub;
  if (setjmp(err.jump) != 0) return Status::IOError("cannot create a JPEG compressor");
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  const int r = EncodeInto(&cinfo, &err, pixels, width, height, channels, quality, &buf, &len);
  jpeg_destroy_compress(&cinfo);
  if (r == 0) out->assign(buf, buf + len);
  std::free(buf);
  if (r != 0) return Status::IOError(std::string("JPEG encoding failed: ") + err.message);
  return Status::OK();
}

}  // namespace kiln::internal
