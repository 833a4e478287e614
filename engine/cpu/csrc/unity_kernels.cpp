// The kernels, compiled as one translation unit (a "unity build"): the torch headers every file includes take
// ~8 s to parse, so parsing them once here instead of once per file is most of what a first build saves. None of
// these files calls another's functions, so each compiles to the code it would alone. fused_ops.cpp comes last:
// its `#pragma GCC optimize("fp-contract=off")` holds to the end of the unit.
#include "small_batch_linear.cpp"
#include "paged_attention.cpp"
#include "activation.cpp"
#include "fused_ops.cpp"
