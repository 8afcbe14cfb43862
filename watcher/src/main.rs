/// mimalloc: each pass over the watch caches allocates and frees many small strings; with
/// glibc's malloc a pass over 10,000 Ingresses took about 1.5 times as long (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_watcher::Cli::parse_and_run().await)
}
