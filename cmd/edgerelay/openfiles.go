package main

import (
	"log/slog"

	"edgerelay/fastpath/server"
)

// storeFiles is what Pebble and the process itself may hold open besides
// connections: Pebble keeps up to 1,000 table files open by default.
const storeFiles = 1100

// warnOpenFiles logs a warning at start when the open-files limit is below
// what the connection caps allow: the caps should refuse a connection
// before the kernel does (netlimit rides out running out of descriptors,
// but the store shares the budget and could fail a write meanwhile).
func warnOpenFiles(log *slog.Logger, services []server.Service) {
	limit, ok := openFilesLimit()
	if !ok {
		return
	}
	need := uint64(storeFiles)
	for _, svc := range services {
		if svc.Limits.MaxConns <= 0 {
			log.Warn("a listener has no connection cap: set RELAY_MAX_CONNS so that it refuses connections before the open-files limit does",
				"service", svc.Name, "open_files_limit", limit)
			return
		}
		// A WebSocket or agent link holds one descriptor; a listener
		// also holds two of its own (its socket and a spare).
		need += uint64(svc.Limits.MaxConns) + 2
	}
	if limit < need {
		log.Warn("the open-files limit is below what the connection caps allow: raise it (LimitNOFILE= in systemd) or lower RELAY_MAX_CONNS",
			"open_files_limit", limit, "needed", need)
	}
}
