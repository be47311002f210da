//! Rebuild the kernel object when bpf-linker changes: it is the linker of the
//! bpf target, but cargo does not track linkers.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo::rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo::warning=bpf-linker not found ({err}); run `cargo xtask setup`");
        }
    }
}
