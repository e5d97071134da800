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

bench:
	bash bench/run.sh

fuzz:
	bash fuzz/run.sh $(FUZZTIME)
