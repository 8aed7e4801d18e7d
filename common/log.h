// One-line logs for the servers: "2026-11-30T17:20:01.123Z pdq-decode: ...",
// to stderr, whole lines (one write each, so lines of several threads never
// interleave).
#pragma once

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>

namespace pdq {

inline std::string& LogProcessName() {
  static std::string name = "pdq";
  return name;
}

// "2026-11-30T17:20:01.123Z": now, UTC, to the millisecond.
inline std::string LogStamp() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm utc;
  gmtime_r(&tv.tv_sec, &utc);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                (int)(tv.tv_usec / 1000));
  return stamp;
}

inline void LogLine(std::string_view message) {
  std::string line = LogStamp();
  line += ' ';
  line += LogProcessName();
  line += ": ";
  line += message;
  line += '\n';
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace pdq
