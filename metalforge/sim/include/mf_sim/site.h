// metalforge.sim — the call-site parameters of the collectives (simd.h, matrix.h): the file
// (::mf::Loc, simd.h), line and column of the caller, as defaulted trailing parameters
// (MF_SITE_PARAMS) and as the arguments that pass them on (MF_SITE).
//
// No include guard on purpose: each header that uses them includes this file and #undefs
// both at its end, so that they never reach the kernel's source.
#define MF_SITE_PARAMS                                                      \
  ::mf::Loc mf_file = __builtin_FILE(), unsigned mf_line = __builtin_LINE(), \
            unsigned mf_col = MF_COLUMN()
#define MF_SITE mf_file, mf_line, mf_col
