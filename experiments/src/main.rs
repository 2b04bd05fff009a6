//! The `rlany` command; see the crate docs of `rlany` (experiments/src/lib.rs).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    quiet_on_closed_stdout();
    std::process::ExitCode::from(rlany::cli_main(std::env::args_os()))
}

/// `rlany env … | head`: once the reader is gone, printing fails; the command then ends
/// quietly with exit 0 instead of a panic message and a backtrace. SIGPIPE stays ignored
/// (Rust's default), so a crashed environment child is an error on its pipe that the run
/// counts, not the death of the run.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info)
    }));
}
