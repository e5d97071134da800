package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/ws"
)

// startParker starts the parker every service's idle WebSockets wait in
// (RELAY_WS_PARK), and its gauge: nil when parking is off, or when this
// build cannot park (then said once in the log: sockets keep a goroutine).
func startParker(cfg config.Config, reg prometheus.Registerer, log *slog.Logger) (*ws.Parker, error) {
	if !cfg.Limits.ParkSockets {
		return nil, nil
	}
	p, err := ws.NewParker()
	if errors.Is(err, ws.ErrParkUnsupported) {
		log.Info("idle WebSockets keep their goroutines", "reason", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("park idle sockets: %w", err)
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgerelay_ws_parked_sockets",
		Help: "WebSockets parked now: idle, without a goroutine, waiting in the epoll set (RELAY_WS_PARK).",
	}, func() float64 { return float64(p.Parked()) })); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("park metrics: %w", err)
	}
	return p, nil
}
