.PHONY: test demo bench fuzz lint

# Vet and race-test every module, starting the servers the adapters need.
test:
	./scripts/test.sh

# The payments demo on the in-memory store.
demo:
	go run ./cmd/paydemo

# Core benchmarks on the in-memory store.
bench:
	go test -run '^$$' -bench . -benchmem .

# Fuzz every target for FUZZTIME each (default 2m), one at a time; plain
# `make test` runs them on their seed corpus only. See scripts/fuzz.sh.
fuzz:
	./scripts/fuzz.sh

# staticcheck on every module (not part of test: see scripts/lint.sh).
lint:
	./scripts/lint.sh
