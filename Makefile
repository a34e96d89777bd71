.PHONY: test demo bench

# Vet and race-test every module, starting the servers the adapters need.
test:
	./scripts/test.sh

# The payments demo on the in-memory store.
demo:
	go run ./cmd/paydemo

# Core benchmarks on the in-memory store.
bench:
	go test -run '^$$' -bench . -benchmem .
