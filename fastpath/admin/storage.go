package admin

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterStorage adds edgerelay_store_writes_refused to reg: 1 while
// unavailable reports a reason (disk below the reserve, store stalled or
// failed), else 0, for an alert that does not wait for a balancer to
// notice /readyz.
func RegisterStorage(reg prometheus.Registerer, unavailable func() error) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgerelay_store_writes_refused",
		Help: "1 while the store refuses writes (free space below RELAY_DISK_RESERVE, Pebble stalled or failed), else 0.",
	}, func() float64 {
		if unavailable() != nil {
			return 1
		}
		return 0
	})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("admin: store metrics: %w", err)
	}
	return nil
}
