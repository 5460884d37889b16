// Package bpf holds offcpu's BPF programs and their Go bindings.
//
// The generated *_bpfel.go and *_bpfel.o files, one pair a program and
// architecture (x86 for amd64, arm64), are committed so that a fresh
// machine builds with Go alone. To regenerate them after editing a
// .bpf.c file (needs clang and libbpf headers: apt-get install clang llvm libbpf-dev):
//
//	go generate ./bpf
package bpf

//go:generate go run ./internal/cconst/gen -o constants_gen.go -pkg bpf -skip offcpu_stat offcpu_shared.h goroutines_shared.h ruby_shared.h

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64,arm64 -type offcpu_key -type offcpu_val -type thread_key -type thread_cpu -type wake_key -type cpu_key -type prestart_val -type stack_buf -type thread_info -type unwind_row -type unwind_map -type unwind_proc -type proc_event -type map_event -type file_key -type file_unwind -type java_method_key -type java_proc -type tctx_proc -type tctx_key -type tctx_link -type obi_trace_ctx -type wait_event -type ruby_proc -type ruby_frame_key Offcpu offcpu.bpf.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64,arm64 -type go_offsets -type go_gkey -type go_park -type go_key -type go_val -type go_stack -type go_link_key -type go_link_val -type go_wait_event Goroutines goroutines.bpf.c
