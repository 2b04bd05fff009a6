//! The `rlany` command; see the crate docs of `rlany` (experiments/src/lib.rs).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rlany::cli_main(std::env::args_os()))
}
