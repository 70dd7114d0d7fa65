// Hopper bulk copies (cp.async.bulk, sm_90+) between global and shared memory.
//
// A load completes on an mbarrier (transaction bytes); stores go in bulk
// groups. Both carry an L2 evict-first policy: the data moved is touched once
// (+1 point of the copy bandwidth on kimi-k2-prefill over no hint).
// Callers compile these only under __CUDA_ARCH__ >= 900.
#pragma once

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Bytes of dynamic shared memory this launch was given.
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned long long evict_first_policy() {
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// Make `barrier` an mbarrier of one arrival a phase (its phase 0 pending).
__device__ __forceinline__ void mbarrier_init(unsigned barrier) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(barrier));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The one arrival of the barrier's current phase, which then completes once
// `bytes` of transactions (the bulk loads it is given) have landed.
__device__ __forceinline__ void mbarrier_arrive_expect(unsigned barrier, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(barrier), "r"(bytes) : "memory");
}

// Arm mbarrier `barrier` (one arrival) for `bytes` of transactions: a
// barrier used once, whose phase 0 mbarrier_wait waits for.
__device__ __forceinline__ void mbarrier_expect(unsigned barrier, unsigned bytes) {
    mbarrier_init(barrier);
    mbarrier_arrive_expect(barrier, bytes);
}

// Spin until phase 0 of mbarrier `barrier` completes.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_LOADED_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 "@!done bra WAIT_LOADED_%=;\n"
                 "}" :: "r"(barrier) : "memory");
}

// Spin until the phase of mbarrier `barrier` whose parity is `parity`
// completes (a barrier used again and again: phase n has parity n & 1).
__device__ __forceinline__ void mbarrier_wait_parity(unsigned barrier, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_PHASE_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_PHASE_%=;\n"
                 "}" :: "r"(barrier), "r"(parity) : "memory");
}

// One bulk copy global -> shared, completing on mbarrier `barrier`.
__device__ __forceinline__ void bulk_load(unsigned stage, const void* src, unsigned bytes,
                                          unsigned barrier) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(stage), "l"(src), "r"(bytes), "r"(barrier), "l"(evict_first_policy())
                 : "memory");
}

// One bulk copy shared -> global, in the thread's current bulk group.
__device__ __forceinline__ void bulk_store(void* dst, unsigned stage, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;"
                 :: "l"(dst), "r"(stage), "r"(bytes), "l"(evict_first_policy()) : "memory");
}

// Close the thread's bulk group and wait until the engine has read its
// sources: the block may not retire while its shared stage is still read.
__device__ __forceinline__ void bulk_stores_done_reading() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Make this thread's generic-proxy writes to shared memory visible to the
// bulk engine's reads.
__device__ __forceinline__ void fence_shared_for_bulk() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
#endif
