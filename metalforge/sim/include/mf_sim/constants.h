// metalforge.sim — function constants.
//
// rewrite.py turns `constant T name [[function_constant(n)]];` into
// `static constexpr T name = ::mf::function_constant<T, n>();` and a flag
// `mf_fc_defined_name`.  Values given to compile_shader(..., function_constants=...) arrive as
// specialisations of mf::fc_value<n> placed before the source; an index without one is
// undefined, as on Metal when the pipeline gives no value: is_function_constant_defined() is
// false and the constant reads as zero (false), where Metal leaves the value unspecified.
#ifndef MF_SIM_CONSTANTS_H
#define MF_SIM_CONSTANTS_H

namespace mf {
template <int N>
struct fc_value {
  static constexpr bool defined = false;
  static constexpr int value = 0;
};
template <class T, int N>
constexpr T function_constant() {
  return T(fc_value<N>::value);
}
}  // namespace mf

#define is_function_constant_defined(name) mf_fc_defined_##name

#endif  // MF_SIM_CONSTANTS_H
