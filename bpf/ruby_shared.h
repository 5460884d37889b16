/* CRuby: what the walker and user space (runtimes/ruby) share. */
#ifndef OFFCPU_RUBY_SHARED_H
#define OFFCPU_RUBY_SHARED_H

/* A Ruby frame's entry in a stack: tag 3 in the top bits; bit 60 set for
 * a frame of a method written in C (the low bits: its method entry),
 * clear for a frame of Ruby code (the low bits: its iseq, bits 47-59 the
 * instruction it is at, RUBY_POS_NONE: not known). */
#define RUBY_FRAME_TAG 0x6000000000000000ULL
#define RUBY_CFUNC_BIT 0x1000000000000000ULL
#define RUBY_POS_NONE 0x1fffULL
#define RUBY_PTR_MASK 0x7fffffffffffULL

/* Frame flags (ep[0]) of the VM's control frames. */
#define RUBY_MAGIC_MASK 0x7fff0001ULL
#define RUBY_MAGIC_CFUNC 0x55550001ULL
#define RUBY_FLAG_FINISH 0x20ULL

/* A CRuby process's layout (from its version's headers) and addresses.
 * The thread's execution context is the TLS variable ruby_current_ec of
 * libruby: its module id in the GOT slot tls_got, at tls_offset in the
 * module's block. Offsets are bytes. */
struct ruby_proc {
	u64 tls_got;
	u64 tls_offset;
	u16 ec_vm_stack, ec_vm_stack_size, ec_cfp, ec_thread;
	u16 cfp_size, cfp_pc, cfp_iseq, cfp_ep;
	u16 iseq_body, body_encoded;
	u16 th_ractor, th_ec, th_tid, th_gvl_node, th_gvl_cond;
	u16 ractor_gvl; /* the GVL in its ractor; its owner at offset 0 */
	u16 gvl_lock;   /* the GVL's mutex, in the GVL */
	u16 gvl_switch; /* its two yield conditions (switch_cond, switch_wait_cond) */
	u16 pad[2];
};

/* A Ruby frame seen in a stack (its entry less the position), for user
 * space to name while the process lives. */
struct ruby_frame_key {
	u32 tgid;
	u32 pad;
	u64 entry;
};

#endif
