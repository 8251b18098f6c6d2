#include "timeline.h"

#include <algorithm>
#include <sstream>

namespace tfhvd {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string Timeline::PathForRank(const std::string& path, int rank) {
  auto pos = path.find("{rank}");
  if (pos != std::string::npos) {
    std::string out = path;
    out.replace(pos, 6, std::to_string(rank));
    return out;
  }
  return rank == 0 ? path : std::string();
}

Status Timeline::Start(const std::string& path, int rank, bool mark_cycles) {
  std::lock_guard<std::mutex> l(mu_);
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Status::InvalidArgument("tfhvd: cannot open timeline file '" + path + "' for writing");
  }
  file_ = f;
  first_ = true;
  rank_ = rank;
  mark_cycles_ = mark_cycles;
  rows_.clear();
  start_ = std::chrono::steady_clock::now();
  start_epoch_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  std::fputs("[\n]", file_);
  std::fflush(file_);
  on_ = true;
  std::ostringstream o;
  o << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << rank_
    << ", \"args\": {\"name\": \"rank " << rank_ << "\"}}";
  Write(o.str());
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> l(mu_);
  on_ = false;
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
}

int64_t Timeline::NowMicros() const { return Micros(std::chrono::steady_clock::now()); }

int64_t Timeline::Micros(std::chrono::steady_clock::time_point t) const {
  return start_epoch_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(t - start_).count();
}

void Timeline::Queued(const std::string& name, std::chrono::steady_clock::time_point enqueued) {
  if (!on_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(mu_);
  if (file_ == nullptr) return;
  int64_t ts = std::max<int64_t>(Micros(enqueued), 0);
  std::ostringstream o;
  o << "{\"name\": \"QUEUE\", \"ph\": \"X\", \"ts\": " << ts << ", \"dur\": " << NowMicros() - ts
    << ", \"pid\": " << rank_ << ", \"tid\": " << Row(name) << "}";
  Write(o.str());
}

void Timeline::Write(const std::string& event) {
  // Overwrite the closing bracket, append the event, close again.
  std::fseek(file_, -1, SEEK_END);
  std::fputs(first_ ? "" : ",\n", file_);
  std::fputs(event.c_str(), file_);
  std::fputs("\n]", file_);
  std::fflush(file_);
  first_ = false;
}

int Timeline::Row(const std::string& name) {
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  int row = static_cast<int>(rows_.size()) + 1;
  rows_[name] = row;
  std::ostringstream o;
  o << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << rank_ << ", \"tid\": " << row
    << ", \"args\": {\"name\": \"" << JsonEscape(name) << "\"}}";
  Write(o.str());
  return row;
}

void Timeline::NegotiateStart(const std::string& name, const char* op) {
  if (!on_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(mu_);
  if (file_ == nullptr) return;
  std::ostringstream o;
  o << "{\"name\": \"NEGOTIATE_" << op << "\", \"ph\": \"B\", \"ts\": " << NowMicros()
    << ", \"pid\": " << rank_ << ", \"tid\": " << Row(name) << "}";
  Write(o.str());
}

void Timeline::Start(const std::string& name, const std::string& activity, int64_t bytes) {
  if (!on_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(mu_);
  if (file_ == nullptr) return;
  std::ostringstream o;
  o << "{\"name\": \"" << activity << "\", \"ph\": \"B\", \"ts\": " << NowMicros()
    << ", \"pid\": " << rank_ << ", \"tid\": " << Row(name);
  if (bytes >= 0) o << ", \"args\": {\"bytes\": " << bytes << "}";
  o << "}";
  Write(o.str());
}

void Timeline::NegotiateEnd(const std::string& name) { End(name); }

void Timeline::End(const std::string& name) {
  if (!on_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(mu_);
  if (file_ == nullptr) return;
  std::ostringstream o;
  o << "{\"ph\": \"E\", \"ts\": " << NowMicros() << ", \"pid\": " << rank_
    << ", \"tid\": " << Row(name) << "}";
  Write(o.str());
}

void Timeline::MarkCycle() {
  if (!on_.load(std::memory_order_relaxed) || !mark_cycles_) return;
  std::lock_guard<std::mutex> l(mu_);
  if (file_ == nullptr) return;
  std::ostringstream o;
  o << "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"p\", \"ts\": " << NowMicros()
    << ", \"pid\": " << rank_ << ", \"tid\": 0}";
  Write(o.str());
}

}  // namespace tfhvd
