#include "stall_report.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "process_set.h"

namespace tfhvd {

std::string DivergenceSummary(const std::vector<StalledCollective>& stalled) {
  // Submitting ranks -> the names they wait in (first name kept in order).
  std::map<std::vector<int>, std::vector<std::string>> groups;
  for (const auto& s : stalled) {
    if (!s.submitted.empty()) groups[s.submitted].push_back(s.name);
  }
  if (groups.size() < 2) return "";
  std::vector<int> seen;
  for (const auto& g : groups) {
    for (int r : g.first) {
      if (std::find(seen.begin(), seen.end(), r) != seen.end()) return "";
      seen.push_back(r);
    }
  }
  std::ostringstream out;
  out << "the ranks are waiting in different collectives (they run different code, or in a "
         "different order):";
  for (auto& g : groups) {
    std::vector<std::string>& names = g.second;
    std::sort(names.begin(), names.end());
    out << "\n  ranks " << RanksString(g.first) << " wait in '" << names.front() << "'";
    if (names.size() > 1) out << " (and " << names.size() - 1 << " more)";
  }
  return out.str();
}

}  // namespace tfhvd
