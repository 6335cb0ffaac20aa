// A test's page advisor (core/page_cache.h): every advisor made while an
// AdvisorScope lives is an Advisor(state); the kernel's again after it.
#ifndef KILN_TESTS_CORE_ADVISOR_SCOPE_H_
#define KILN_TESTS_CORE_ADVISOR_SCOPE_H_

#include <memory>

#include "core/page_cache.h"

namespace kiln {
namespace testing {

template <typename Advisor, typename State>
class AdvisorScope {
 public:
  explicit AdvisorScope(State* state) {
    SetPageAdvisorFactoryForTesting([state] { return std::make_unique<Advisor>(state); });
  }
  ~AdvisorScope() { SetPageAdvisorFactoryForTesting(nullptr); }
  AdvisorScope(const AdvisorScope&) = delete;
  AdvisorScope& operator=(const AdvisorScope&) = delete;
};

}  // namespace testing
}  // namespace kiln

#endif  // KILN_TESTS_CORE_ADVISOR_SCOPE_H_
