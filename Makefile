GO ?= go
FUZZTIME ?= 30s

.PHONY: run build test bench fuzz

run:
	$(GO) run ./cmd/edgerelay serve

build:
	$(GO) build -o bin/edgerelay ./cmd/edgerelay

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...
	# The race detector adds allocations of its own: the zero-allocation
	# proofs run once more without it.
	$(GO) test -count=1 -run 'Alloc' ./...

bench:
	bash bench/run.sh

fuzz:
	bash fuzz/run.sh $(FUZZTIME)
