// The combining step of hierarchical (multi-host) collectives: `dst[i] = src[0][i] (op) src[1][i]
// (op) ... (op) src[k-1][i]` for `i < count`, where `src[j]` is the j-th of `k` contiguous blocks of
// `count` elements at `src`. Each element is reduced in block order in the accumulation type and
// rounded once (symcomm::Accumulator, as the collectives do); Avg divides the sum by `divisor`
// (the communicator's size: the blocks are partial sums of several ranks), the other operators
// ignore it.
//
// Launch: any 1-D grid and block (a grid-stride loop over `count` elements). `dst` may be the
// first block of `src` (each element is read from every block before it is written); otherwise it
// overlaps no block. `dtype` and `redop` are SYMCOMM_DTYPE_* / SYMCOMM_REDOP_* codes; other codes
// do nothing (the host validated them). Pre: k >= 1, divisor >= 1.
#include <symcomm/symcomm.cuh>

namespace {

using namespace symcomm;

template <typename T, RedOp Op>
struct Combine {
    static SYMCOMM_DEVICE void run(const void* src, void* dst, uint64_t count, uint32_t k,
                                   uint32_t divisor) {
        const T* in = static_cast<const T*>(src);
        T* out = static_cast<T*>(dst);
        const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
        for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
            Accumulator<T, Op> a;
            a.first(in[i]);
            for (uint32_t j = 1; j < k; ++j) {
                a.add(in[uint64_t(j) * count + i]);
            }
            out[i] = a.result(divisor);
        }
    }
};

}  // namespace

extern "C" __global__ void symcomm_combine(const void* src, void* dst, uint64_t count, uint32_t k,
                                           uint32_t dtype, uint32_t redop, uint32_t divisor) {
    dispatch<Combine>(DataType(dtype), RedOp(redop), src, dst, count, k, divisor);
}
SYMCOMM_EMU_KERNEL(symcomm_combine)
