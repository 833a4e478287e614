// decode_layer.cpp, which calls the kernels of unity_kernels.cpp, compiled apart from them (so that none of them
// is inlined into it, as when every file was its own unit), with sampling.cpp and prefill_attention.cpp; see
// unity_kernels.cpp.
#include "decode_layer.cpp"
#include "sampling.cpp"
#include "prefill_attention.cpp"
