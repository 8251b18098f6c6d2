// Stall reports: what the stall inspector says beyond "these names waited".
//
// A job whose ranks run different code hangs with each group of ranks
// waiting in its own collective: rank 0 in a broadcast, rank 1 in an
// allreduce, say.  Listing every stalled name with its missing ranks leaves
// the user to notice that the lists are complementary.  DivergenceSummary
// says it outright: it groups the stalled names by the ranks that submitted
// them and, when two or more groups of ranks wait in different collectives,
// names one collective of each group.
#ifndef TFHVD_CORE_STALL_REPORT_H_
#define TFHVD_CORE_STALL_REPORT_H_

#include <string>
#include <vector>

namespace tfhvd {

struct StalledCollective {
  std::string name;            // as the timeline shows it (set prefix included)
  std::vector<int> submitted;  // world ranks that submitted it, ascending
};

// "" unless the stalled collectives fall into two or more groups whose
// submitting ranks do not overlap; else one line per group:
//   ranks [0] wait in 'HorovodBroadcastVar_0' (and 3 more)
// preceded by a sentence saying that the ranks run different collectives.
std::string DivergenceSummary(const std::vector<StalledCollective>& stalled);

}  // namespace tfhvd

#endif  // TFHVD_CORE_STALL_REPORT_H_
