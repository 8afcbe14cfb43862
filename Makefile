# Shortcuts; the README's commands are the reference.
.PHONY: fmt lint test e2e e2e-haproxy30 demo smoke bench

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	shellcheck -s sh applier/src/host/scripts/*.sh

test:
	./tests/run.sh

e2e:
	./tests/run.sh -p hafleet-tests

e2e-haproxy30:
	./tests/run-haproxy30.sh

demo:
	./deploy/local/demo.sh

smoke:
	./deploy/local/demo.sh --smoke

bench:
	cargo bench -p hafleet-renderer --bench render
	cargo bench -p hafleet-renderer --bench scale
	cargo build --release --workspace --bins
	target/release/hafleet-bench
	target/release/hafleet-bench routing
	target/release/hafleet-bench history
	target/release/hafleet-bench reload
	target/release/hafleet-bench watcher
	target/release/hafleet-bench tls
