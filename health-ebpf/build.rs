//! Rebuild the kernel object when bpf-linker changes: it is the linker of the
//! bpf target, but cargo does not track linkers. And let LLVM expand small
//! `memset`s and `memcpy`s into stores: by default bpf-linker asks it to
//! keep them in order (`--bpf-expand-memcpy-in-order`), and LLVM then calls
//! aya-ebpf's `memset` instead, a loop that stores one byte a turn (a
//! flow's 50 bytes zeroed on every packet cost 250 instructions).
fn main() {
    println!("cargo::rustc-link-arg-bins=--disable-expand-memcpy-in-order");
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo::rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo::warning=bpf-linker not found ({err}); run `cargo xtask setup`");
        }
    }
}
