package turn

import (
	"net/netip"
	"sync"
	"time"
)

// Quota defaults, used where Config leaves a limit at 0. They suit a relay
// for a few thousand devices; an operator behind carrier-grade NAT (many
// devices sharing one client IP) may want a larger per-IP figure.
const (
	DefaultMaxAllocations = 10000 // allocations in total
	DefaultMaxPerUser     = 32    // per REST label (the username after "<expiry>:")
	DefaultMaxPerIP       = 256   // per client IP address
)

// Quota names, as in the refusal metric's label.
const (
	quotaTotal = "total"
	quotaUser  = "user"
	quotaIP    = "ip"
	quotaPorts = "ports" // relay port range exhausted: 508, not 486
)

// pendingTTL bounds how long a reservation waits for pion to report the
// allocation it was made for. pion reports both outcomes (created, or an
// error from the same request) before it reads the next request on that
// socket, so this only matters if a future pion forgets to.
const pendingTTL = 10 * time.Second

// quotas counts allocations by total, REST label and client IP. pion asks
// before creating an allocation (QuotaHandler) but creation can still fail
// after that (the relay ports are exhausted), so the question reserves a
// slot, and pion's events later commit or cancel it. Two TCP connections
// can race for the last slot; the reservation makes sure only one gets it.
type quotas struct {
	maxTotal, maxUser, maxIP int // < 0: unlimited

	mu      sync.Mutex
	total   int
	byUser  map[string]int
	byIP    map[netip.Addr]int
	pending map[clientKey]slot
	live    map[tuple]slot
}

// clientKey is what pion's quota question identifies a client by: its
// transport address and whether it came over a stream.
type clientKey struct {
	stream bool
	client netip.AddrPort
}

// slot is one counted allocation (or reservation for one).
type slot struct {
	user    string
	ip      netip.Addr
	expires time.Time // pending reservations only
}

func newQuotas(maxTotal, maxUser, maxIP int) *quotas {
	return &quotas{
		maxTotal: maxTotal, maxUser: maxUser, maxIP: maxIP,
		byUser:  make(map[string]int),
		byIP:    make(map[netip.Addr]int),
		pending: make(map[clientKey]slot),
		live:    make(map[tuple]slot),
	}
}

// reserve takes a slot for a client about to be given an allocation, or
// names the quota that is full.
func (q *quotas) reserve(k clientKey, username string, now time.Time) (full string) {
	user, ip := restLabel(username), k.client.Addr()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sweep(now)
	if old, ok := q.pending[k]; ok {
		// A retried Allocate from the same client before pion reported on
		// the first: the old reservation is superseded.
		q.drop(old)
		delete(q.pending, k)
	}
	switch {
	case q.maxTotal >= 0 && q.total >= q.maxTotal:
		return quotaTotal
	case q.maxUser >= 0 && q.byUser[user] >= q.maxUser:
		return quotaUser
	case q.maxIP >= 0 && q.byIP[ip] >= q.maxIP:
		return quotaIP
	}
	s := slot{user: user, ip: ip, expires: now.Add(pendingTTL)}
	q.add(s)
	q.pending[k] = s
	return ""
}

// commit turns the client's reservation into a live allocation under t.
// An allocation with no reservation (none should exist) is counted anyway,
// so that its deletion balances.
func (q *quotas) commit(t tuple, username string) {
	k := clientKey{t.stream, t.client}
	q.mu.Lock()
	defer q.mu.Unlock()
	s, ok := q.pending[k]
	if ok {
		delete(q.pending, k)
	} else {
		s = slot{user: restLabel(username), ip: t.client.Addr()}
		q.add(s)
	}
	s.expires = time.Time{}
	q.live[t] = s
}

// cancel gives back a reservation whose allocation was not made.
func (q *quotas) cancel(k clientKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s, ok := q.pending[k]; ok {
		delete(q.pending, k)
		q.drop(s)
	}
}

// release gives back the slot of a deleted allocation.
func (q *quotas) release(t tuple) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s, ok := q.live[t]; ok {
		delete(q.live, t)
		q.drop(s)
	}
}

func (q *quotas) add(s slot) {
	q.total++
	q.byUser[s.user]++
	q.byIP[s.ip]++
}

func (q *quotas) drop(s slot) {
	q.total--
	if q.byUser[s.user]--; q.byUser[s.user] <= 0 {
		delete(q.byUser, s.user)
	}
	if q.byIP[s.ip]--; q.byIP[s.ip] <= 0 {
		delete(q.byIP, s.ip)
	}
}

// sweep drops reservations nobody reported on in time.
func (q *quotas) sweep(now time.Time) {
	for k, s := range q.pending {
		if now.After(s.expires) {
			delete(q.pending, k)
			q.drop(s)
		}
	}
}
