// The system allocator: mimalloc made a pass over 10,000 Ingresses 4 ms faster (14 against
// 19 ms) and the watcher's peak memory 30 MB larger (128 against 98 MB); see BENCHMARKS.md.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_watcher::Cli::parse_and_run().await)
}
