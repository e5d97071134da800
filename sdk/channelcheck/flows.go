package channelcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf16"

	"github.com/fasthttp/websocket"
)

// maxFrame is the largest phone frame the contract allows, in bytes.
const maxFrame = 70000

// specialText is a phone frame a relay that builds its control messages by
// hand could get wrong: JSON's own syntax, every kind of character JSON
// must or may escape, text that looks like a control message, and
// characters outside the BMP (which UTF-16 based relays split in two).
const specialText = "quote \" backslash \\ slash / nul \x00 bell \x07 tab \t newline \n cr \r esc \x1b del \x7f " +
	"html <b>&amp; latin é ß ñ cjk 中文 line-sep \u2028 para-sep \u2029 bom \ufeff " +
	"emoji 😀 👍🏽 🇫🇷 👩‍👩‍👧 injected \",\"type\":\"close\",\"id\":\"x end"

// controlMessage is a control-socket message as the relay sends it.
type controlMessage struct {
	Type string  `json:"type"`
	ID   string  `json:"id"`
	Data *string `json:"data"`
	raw  []byte
}

func (m controlMessage) String() string { return quote(m.raw) }

// connectComputer opens p's control socket with its owner token.
func (c *checker) connectComputer(ctx context.Context, p *party) error {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+p.owner)
	conn, err := c.dial(ctx, "computer "+p.label, "/host", h)
	if err != nil {
		return err
	}
	p.computer = conn
	return nil
}

// connectPhone opens a phone channel to p's computer, presenting the phone
// token in the given header, once the relay shows the computer as
// connected (see awaitConnected for why that wait is needed).
func (c *checker) connectPhone(ctx context.Context, p *party, header, value string) error {
	if err := c.awaitConnected(ctx, p); err != nil {
		return fmt.Errorf("computer %s never showed as connected: %w", p.label, err)
	}
	h := http.Header{}
	h.Set(header, value)
	conn, err := c.dial(ctx, "phone "+p.label, "/botharness-device/channel", h)
	if err != nil {
		return err
	}
	p.phone = conn
	return nil
}

// expectOpen requires p's computer to be told about its new phone, and
// remembers the channel's id.
func (c *checker) expectOpen(ctx context.Context, p *party) error {
	m, err := c.nextControl(ctx, p)
	if err != nil {
		return err
	}
	if m.Type != "open" || !isID(m.ID) {
		return fmt.Errorf("computer %s got %s, want {\"type\":\"open\",\"id\":\"<32 lowercase hex>\"}", p.label, c.describe(m))
	}
	p.id = m.ID
	return nil
}

// nextControl reads the next message on p's control socket. Messages for
// p's earlier channels are skipped: a close is correct, merely late, and
// data is a leftover of a check that failed and gave that channel up.
func (c *checker) nextControl(ctx context.Context, p *party) (controlMessage, error) {
	for {
		wm, err := p.computer.next(ctx)
		if err != nil {
			return controlMessage{}, err
		}
		if wm.kind != websocket.TextMessage {
			return controlMessage{}, fmt.Errorf("computer %s got a binary frame %s, want JSON text", p.label, quote(wm.data))
		}
		m := controlMessage{raw: wm.data}
		if err := json.Unmarshal(wm.data, &m); err != nil {
			return controlMessage{}, fmt.Errorf("computer %s got %s, not a JSON control message: %w", p.label, quote(wm.data), err)
		}
		if p.staleIDs[m.ID] {
			c.logf("computer %s: skipped %s message for earlier channel %s", p.label, m.Type, m.ID)
			continue
		}
		return m, nil
	}
}

// expectData requires the next control message of p to carry want from
// p's current phone.
func (c *checker) expectData(ctx context.Context, p *party, want string) error {
	m, err := c.nextControl(ctx, p)
	if err != nil {
		return err
	}
	return c.dataIs(p, m, want)
}

func (c *checker) dataIs(p *party, m controlMessage, want string) error {
	switch {
	case m.Data == nil || m.Type != "data" || m.ID != p.id:
		return fmt.Errorf("computer %s got %s, want a data message for id %s", p.label, c.describe(m), p.id)
	case *m.Data != want:
		return fmt.Errorf("computer %s got data for its phone that differs from what the phone sent: %s%s", p.label, diff(*m.Data, want), c.whose(*m.Data))
	}
	return nil
}

// sendPhone sends frame from p's phone.
func (c *checker) sendPhone(ctx context.Context, p *party, frame string) error {
	c.remember(frame, "phone "+p.label)
	return p.phone.writeText(ctx, []byte(frame))
}

// remember notes who sent frame in which check. Every frame is unique (it
// carries a nonce), so when one turns up where it should not, the error
// can say where it came from; after one failed check, that tells the
// reader which later failures are its echoes.
func (c *checker) remember(frame, sender string) {
	c.sent[frame] = fmt.Sprintf("%s's frame from check %q", sender, c.current)
}

// describe shows a control message in an error, with whose data it carries.
func (c *checker) describe(m controlMessage) string {
	if m.Data != nil {
		return m.String() + c.whose(*m.Data)
	}
	return m.String()
}

// whose describes data if the checker sent it, for an error message.
func (c *checker) whose(data string) string {
	if s, ok := c.sent[data]; ok {
		return " (" + s + ")"
	}
	return ""
}

// sendData sends data to the phone channel id over p's control socket.
func (c *checker) sendData(ctx context.Context, p *party, id, data string) error {
	b, err := json.Marshal(struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Data string `json:"data"`
	}{"data", id, data})
	if err != nil {
		return fmt.Errorf("encode data message: %w", err)
	}
	c.remember(data, "computer "+p.label)
	return p.computer.writeText(ctx, b)
}

// expectPhone requires p's phone to receive want as its next frame.
func (c *checker) expectPhone(ctx context.Context, p *party, want string) error {
	m, err := p.phone.next(ctx)
	if err != nil {
		return err
	}
	return c.phoneGot(p, m, want)
}

func (c *checker) phoneGot(p *party, m wsMessage, want string) error {
	switch {
	case m.kind != websocket.TextMessage:
		return fmt.Errorf("phone %s got a binary frame %s, want text", p.label, quote(m.data))
	case string(m.data) != want:
		return fmt.Errorf("phone %s got a frame that differs from what its computer sent: %s%s", p.label, diff(string(m.data), want), c.whose(string(m.data)))
	}
	return nil
}

// phoneReachesOnlyItsComputer sends a frame from p's phone and requires it
// at p's computer and not at other's. Instead of waiting some time for a
// frame that should not come, it sends a marker through other's channel:
// a relay that also delivered p's frame to other's computer would have
// queued it there first, so other's next message must be the marker.
func (c *checker) phoneReachesOnlyItsComputer(ctx context.Context, p, other *party) error {
	frame := fmt.Sprintf("phone %s to computer %s %s", p.label, p.label, nonce())
	if err := c.sendPhone(ctx, p, frame); err != nil {
		return err
	}
	if err := c.expectData(ctx, p, frame); err != nil {
		return err
	}
	marker := fmt.Sprintf("marker phone %s %s", other.label, nonce())
	if err := c.sendPhone(ctx, other, marker); err != nil {
		return err
	}
	m, err := c.nextControl(ctx, other)
	if err != nil {
		return fmt.Errorf("marker through %s: %w", other.label, err)
	}
	if m.Data != nil && *m.Data == frame {
		return fmt.Errorf("computer %s also received phone %s's frame", other.label, p.label)
	}
	return c.dataIs(other, m, marker)
}

// computerReachesOnlyItsPhone is phoneReachesOnlyItsComputer the other way
// round.
func (c *checker) computerReachesOnlyItsPhone(ctx context.Context, p, other *party) error {
	frame := fmt.Sprintf("computer %s to phone %s %s", p.label, p.label, nonce())
	if err := c.sendData(ctx, p, p.id, frame); err != nil {
		return err
	}
	if err := c.expectPhone(ctx, p, frame); err != nil {
		return err
	}
	marker := fmt.Sprintf("marker computer %s %s", other.label, nonce())
	if err := c.sendData(ctx, other, other.id, marker); err != nil {
		return err
	}
	m, err := other.phone.next(ctx)
	if err != nil {
		return fmt.Errorf("marker through %s: %w", other.label, err)
	}
	if string(m.data) == frame {
		return fmt.Errorf("phone %s also received computer %s's frame", other.label, p.label)
	}
	return c.phoneGot(other, m, marker)
}

// foreignIDIgnored has computer other address p's phone by its id, which
// the contract says reaches nobody: the relay must neither deliver it nor
// drop other's control socket for it.
func (c *checker) foreignIDIgnored(ctx context.Context, p, other *party) error {
	foreign := fmt.Sprintf("computer %s to phone %s's id %s", other.label, p.label, nonce())
	if err := c.sendData(ctx, other, p.id, foreign); err != nil {
		return err
	}
	// A relay reads one control socket in order, so once other's next
	// frame has reached its phone, the foreign one has been dealt with.
	syncFrame := fmt.Sprintf("sync computer %s %s", other.label, nonce())
	if err := c.sendData(ctx, other, other.id, syncFrame); err != nil {
		return err
	}
	if err := c.expectPhone(ctx, other, syncFrame); err != nil {
		return fmt.Errorf("after addressing phone %s's id: %w", p.label, err)
	}
	marker := fmt.Sprintf("marker computer %s %s", p.label, nonce())
	if err := c.sendData(ctx, p, p.id, marker); err != nil {
		return err
	}
	m, err := p.phone.next(ctx)
	if err != nil {
		return err
	}
	if string(m.data) == foreign {
		return fmt.Errorf("phone %s received a frame computer %s addressed to its id", p.label, other.label)
	}
	return c.phoneGot(p, m, marker)
}

// specialUp sends specialText from p's phone to its computer.
func (c *checker) specialUp(ctx context.Context, p *party) error {
	frame := specialText + " " + nonce()
	if err := c.sendPhone(ctx, p, frame); err != nil {
		return err
	}
	return c.expectData(ctx, p, frame)
}

// specialDown sends specialText from p's computer to its phone twice: as
// encoding/json writes it, and written the way another JSON encoder might
// (every non-ASCII character and both quote and backslash as \u escapes,
// surrogate pairs, an escaped slash, keys in another order, whitespace).
func (c *checker) specialDown(ctx context.Context, p *party) error {
	frame := specialText + " " + nonce()
	if err := c.sendData(ctx, p, p.id, frame); err != nil {
		return err
	}
	if err := c.expectPhone(ctx, p, frame); err != nil {
		return fmt.Errorf("encoding/json encoding: %w", err)
	}
	frame = specialText + " " + nonce()
	msg := fmt.Sprintf("{ \"data\" : %s ,\n\t\"id\":\"%s\", \"type\" : \"data\" }", escapeAll(frame), p.id)
	c.remember(frame, "computer "+p.label)
	if err := p.computer.writeText(ctx, []byte(msg)); err != nil {
		return err
	}
	if err := c.expectPhone(ctx, p, frame); err != nil {
		return fmt.Errorf("fully \\u-escaped encoding: %w", err)
	}
	return nil
}

// escapeAll encodes s as a JSON string using \u escapes for everything
// but printable ASCII, and \/ for the slash.
func escapeAll(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '/':
			b.WriteString(`\/`)
		case r >= 0x20 && r < 0x7f && r != '"' && r != '\\':
			b.WriteRune(r)
		default:
			for _, u := range utf16.Encode([]rune{r}) {
				fmt.Fprintf(&b, `\u%04X`, u)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// maxFrame sends a frame of exactly 70,000 bytes each way.
func (c *checker) maxFrame(ctx context.Context, p *party) error {
	up := frameOfSize(maxFrame, "phone "+p.label)
	if err := c.sendPhone(ctx, p, up); err != nil {
		return err
	}
	if err := c.expectData(ctx, p, up); err != nil {
		return fmt.Errorf("phone to computer: %w", err)
	}
	down := frameOfSize(maxFrame, "computer "+p.label)
	if err := c.sendData(ctx, p, p.id, down); err != nil {
		return err
	}
	if err := c.expectPhone(ctx, p, down); err != nil {
		return fmt.Errorf("computer to phone: %w", err)
	}
	return nil
}

// oversize sends a phone frame one byte over the limit: the relay must
// close that phone with 1009 and tell its computer the channel closed.
// The frame holds multi-byte characters, so it has fewer than 70,000
// characters: a relay that counts characters instead of bytes fails here.
func (c *checker) oversize(ctx context.Context, p *party) error {
	frame := frameOfSize(maxFrame, "oversize "+p.label) + "x"
	// The relay may close before it has read the whole frame, so a failed
	// write is no failure by itself: what the relay sent back decides.
	werr := c.sendPhone(ctx, p, frame)
	m, err := p.phone.next(ctx)
	if err == nil {
		return fmt.Errorf("phone %s got a frame %s, want close code 1009", p.label, quote(m.data))
	}
	var ce *closedError
	if !errors.As(err, &ce) {
		return errors.Join(fmt.Errorf("phone %s not closed after a %d-byte frame: %w", p.label, len(frame), err), werr)
	}
	if code := closeCode(ce.err); code != websocket.CloseMessageTooBig {
		return errors.Join(fmt.Errorf("phone %s ended with %s, want close code 1009", p.label, describeClose(ce.err)), werr)
	}
	cm, err := c.nextControl(ctx, p)
	if err != nil {
		return fmt.Errorf("waiting for the close message: %w", err)
	}
	if cm.Type != "close" || cm.ID != p.id {
		return fmt.Errorf("computer %s got %s, want {\"type\":\"close\",\"id\":%q}", p.label, c.describe(cm), p.id)
	}
	p.staleIDs[p.id] = true
	return nil
}

// frameOfSize returns valid UTF-8 text of exactly n bytes, mixing one-,
// three- and four-byte characters and starting with label and a nonce.
func frameOfSize(n int, label string) string {
	const chunk = "0123456789abcdef-€-😀-"
	var b strings.Builder
	b.Grow(n)
	b.WriteString(label + " " + nonce() + " ")
	for b.Len()+len(chunk) <= n {
		b.WriteString(chunk)
	}
	for b.Len() < n {
		b.WriteByte('.')
	}
	return b.String()
}

// reconnectPhone gives p a fresh phone channel (the one before may have
// been closed by the oversize check).
func (c *checker) reconnectPhone(ctx context.Context, p *party) error {
	if p.phone != nil {
		p.phone.close()
	}
	if p.id != "" {
		p.staleIDs[p.id] = true
	}
	if err := c.connectPhone(ctx, p, "Authorization", "Bearer "+p.phoneToken); err != nil {
		return err
	}
	return c.expectOpen(ctx, p)
}

// offline closes p's control socket; the relay must close p's phone with
// 1001 (going away).
func (c *checker) offline(ctx context.Context, p *party) error {
	p.computer.close()
	return c.expectClosed(ctx, p.phone, websocket.CloseGoingAway)
}

// expectClosed waits for the relay to end conn, with close code want
// unless want is 0. Nothing may arrive before the close.
func (c *checker) expectClosed(ctx context.Context, conn *peer, want int) error {
	m, err := conn.next(ctx)
	if err == nil {
		return fmt.Errorf("%s got %s%s, want the socket closed", conn.name, quote(m.data), c.whose(string(m.data)))
	}
	var ce *closedError
	if !errors.As(err, &ce) {
		return err
	}
	c.logf("%s ended: %s", conn.name, describeClose(ce.err))
	if want != 0 && closeCode(ce.err) != want {
		return fmt.Errorf("%s ended with %s, want close code %d", conn.name, describeClose(ce.err), want)
	}
	return nil
}

// roundTrip requires p's phone and computer to still reach each other.
func (c *checker) roundTrip(ctx context.Context, p *party) error {
	up := fmt.Sprintf("phone %s still here %s", p.label, nonce())
	if err := c.sendPhone(ctx, p, up); err != nil {
		return err
	}
	if err := c.expectData(ctx, p, up); err != nil {
		return err
	}
	down := fmt.Sprintf("computer %s still here %s", p.label, nonce())
	if err := c.sendData(ctx, p, p.id, down); err != nil {
		return err
	}
	return c.expectPhone(ctx, p, down)
}

// reconnectComputer opens a new control socket for p after the old one
// closed. The relay learns that the old socket is gone on its own time
// and until then rightly refuses a second one with 403, so refusals are
// retried within the step's bound.
func (c *checker) reconnectComputer(ctx context.Context, p *party) error {
	if p.computer != nil {
		p.computer.close()
	}
	err := poll(ctx, func() error { return c.connectComputer(ctx, p) })
	if err != nil {
		return err
	}
	return c.awaitConnected(ctx, p)
}

// isID reports whether s is a channel id: 32 lowercase hex.
func isID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := range len(s) {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// diff says how got differs from want without printing 70,000 bytes.
func diff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-20)
	return fmt.Sprintf("got %d bytes, want %d; first difference at byte %d: got %s, want %s",
		len(got), len(want), i, quote([]byte(excerpt(got, from))), quote([]byte(excerpt(want, from))))
}

func excerpt(s string, from int) string {
	if from >= len(s) {
		return ""
	}
	return s[from:min(len(s), from+60)]
}
