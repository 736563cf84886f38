// Fiber contexts of the emulator runtime (runtime.cpp): make one on a stack, switch between two.
//
// On x86-64 a context is its stack pointer. context_switch pushes the callee-saved registers and
// the floating-point control words (MXCSR, x87 CW) on the running stack, stores the stack pointer
// into `save` and pops the same from the stack of `to`: a few instructions and no system call.
// glibc's swapcontext saves and restores the signal mask with a system call at every switch, and
// busy emulated kernels switch fibers millions of times (a fifth of the CPU time of the host
// collectives' tests went there). Fibers never change the signal mask, so there is nothing to
// save. Elsewhere: ucontext, as before. ThreadSanitizer sees neither function's memory accesses
// (like swapcontext's, they are the runtime's own, and order nothing between emulated threads).
// Included once, by runtime.cpp (it defines the switch function).
#pragma once

#include <stddef.h>
#include <stdint.h>

#define SYMCOMM_EMU_CONTEXT_FN __attribute__((no_sanitize("thread"))) inline

#if defined(__x86_64__)

extern "C" void symcomm_emu_context_switch(void** save, void* to);

// System V x86-64: rbx, rbp, r12-r15 are callee-saved, and so are MXCSR's control bits and the
// x87 control word.
asm(R"(
    .text
    .p2align 4
    .globl symcomm_emu_context_switch
    .hidden symcomm_emu_context_switch
    .type symcomm_emu_context_switch, @function
symcomm_emu_context_switch:
    endbr64
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size symcomm_emu_context_switch, .-symcomm_emu_context_switch
)");

namespace symcomm_emu_context {

struct Context {
    void* sp = nullptr;
};

/// Makes `ctx` start `entry` (which must never return) on the stack [lo, lo + bytes) at the
/// next switch to it, with the calling thread's floating-point control words.
SYMCOMM_EMU_CONTEXT_FN bool context_make(Context& ctx, unsigned char* lo, size_t bytes, void (*entry)()) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(lo) + bytes) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                      // entry's return address: none (ends backtraces)
    *--sp = reinterpret_cast<uintptr_t>(entry);     // popped by the switch's `ret`
    for (int i = 0; i < 6; ++i) *--sp = 0;          // rbp, rbx, r12-r15
    uint32_t mxcsr = 0;
    uint16_t fpcw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    *--sp = uint64_t(mxcsr) | (uint64_t(fpcw) << 32);
    ctx.sp = sp;  // at entry rsp = top - 8: aligned as after a call
    return true;
}

/// Saves the running context into `save` and runs `to`; returns when something switches back.
SYMCOMM_EMU_CONTEXT_FN void context_switch(Context& save, Context& to) {
    symcomm_emu_context_switch(&save.sp, to.sp);
}

}  // namespace symcomm_emu_context

#else

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

namespace symcomm_emu_context {

struct Context {
    ucontext_t uc;  // not movable once made: glibc points into it
};

SYMCOMM_EMU_CONTEXT_FN bool context_make(Context& ctx, unsigned char* lo, size_t bytes, void (*entry)()) {
    if (getcontext(&ctx.uc) != 0) return false;
    ctx.uc.uc_stack.ss_sp = lo;
    ctx.uc.uc_stack.ss_size = bytes;
    ctx.uc.uc_link = nullptr;
    makecontext(&ctx.uc, entry, 0);
    return true;
}

SYMCOMM_EMU_CONTEXT_FN void context_switch(Context& save, Context& to) {
    if (swapcontext(&save.uc, &to.uc) != 0) {
        perror("symcomm emulator: swapcontext");
        abort();
    }
}

}  // namespace symcomm_emu_context

#endif
