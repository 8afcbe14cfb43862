/// mimalloc: rendering a large fleet allocates and frees many small strings; glibc's malloc
/// spent about a third of a render in allocation and consolidation (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hafleet_runtime::exit_code(hafleet_renderer::Cli::parse_and_run().await)
}
