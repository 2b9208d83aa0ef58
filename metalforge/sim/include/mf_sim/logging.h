// metalforge.sim — <metal_logging>: os_log.  Messages are accepted and dropped (the simulator
// has no log stream); the calls type-check as on Metal 3.2.
#ifndef MF_SIM_LOGGING_H
#define MF_SIM_LOGGING_H

namespace metal {
struct os_log {
  constexpr os_log() = default;
  constexpr os_log(const char*, const char*) {}
  template <class... A> void log(const char*, A...) const {}
  template <class... A> void log_debug(const char*, A...) const {}
  template <class... A> void log_info(const char*, A...) const {}
  template <class... A> void log_error(const char*, A...) const {}
  template <class... A> void log_fault(const char*, A...) const {}
};
constexpr os_log os_log_default;
}  // namespace metal

#endif  // MF_SIM_LOGGING_H
