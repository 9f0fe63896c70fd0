//! Loading eBPF programs and maps with the bpf() syscall (being written).
