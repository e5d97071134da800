GO ?= go
FUZZTIME ?= 30s
FUZZPKG ?= ./...
# make soak: the reliability tests through the binary, SOAK times longer.
SOAK ?= 10

.PHONY: run build test bench fuzz soak cluster js

# make run: the whole relay on loopback with the first-run demo (RELAY_DEMO:
# the demo mailbox app with signal and ice, TURN with a generated secret,
# the SDK's chat example on http://127.0.0.1:8088/examples/chat/).
run: js
	$(GO) run ./cmd/edgerelay serve --demo

# make js: the JavaScript SDK's packages (npm ci, again only when the lock
# file changed) and its build into sdk/js/dist.
js: sdk/js/node_modules/.package-lock.json
	cd sdk/js && npm run --silent build

sdk/js/node_modules/.package-lock.json: sdk/js/package-lock.json sdk/js/package.json
	cd sdk/js && npm ci --no-audit --no-fund

# make cluster: three cluster-mode nodes with embedded NATS on loopback
# (scripts/cluster.sh says which ports); Ctrl-C stops them.
cluster:
	bash scripts/cluster.sh

build:
	$(GO) build -o bin/edgerelay ./cmd/edgerelay

test: js
	$(GO) vet ./...
	cd sdk/js && npm test
	$(GO) test -race -count=1 -timeout 15m $$($(GO) list ./... | grep -v /sdk/js/e2e)
	# fastpath/ws once more with every test server's sockets parked, and the
	# parking packages built without it (the nopark tag: what other systems run).
	WS_TEST_PARK=1 $(GO) test -race -count=1 ./fastpath/ws/
	$(GO) vet -tags nopark ./fastpath/ws/ ./cmd/edgerelay/
	$(GO) test -race -count=1 -tags nopark ./fastpath/ws/ ./fastpath/netlimit/ ./fastpath/server/
	# The SDK's Node and Chromium tests run alone, after the rest: Chromium's
	# processes beside the cluster tests add to the load that delays their 1.5 s liveness timing.
	$(GO) test -race -count=1 -timeout 5m ./sdk/js/e2e/
	# The race detector adds allocations of its own: the zero-allocation
	# proofs run once more without it.
	$(GO) test -count=1 -run 'Alloc' ./...

bench:
	bash bench/run.sh

# make fuzz: see fuzz/run.sh. Red only when a target failed (a reproducer
# is named); FUZZ_GOTOOLCHAIN=go1.27.3 fuzzes on a Go with the fix of the
# deadline flake (not the default: run.sh says why).
fuzz:
	bash fuzz/run.sh $(FUZZTIME) $(FUZZPKG)

# The long reliability run: kill -9 cycles, reconnect storms, hostile
# clients and SIGTERM under load, each SOAK times longer than in make test.
# The timeout bounds it; it stops by itself.
soak:
	EDGERELAY_SOAK=$(SOAK) $(GO) test -count=1 -timeout 60m -v -run 'Reliab|Storm|Hostile|SIGKILL|Survive|SIGTERM|Exhaust' ./cmd/edgerelay/
