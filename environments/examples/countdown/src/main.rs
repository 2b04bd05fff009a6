//! `countdown`: every `rlany` command, with the `Countdown` environment added.

fn main() -> std::process::ExitCode {
    rlany::main_with(rlany::Plugins::builtin().environment::<countdown::CountdownSpec>("Countdown"))
}
