package mailboxbench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// rawClient is a minimal HTTP/1.1 keep-alive client for the read load:
// one connection, one request in flight, prebuilt requests, responses
// parsed just enough to check them. It exists because fasthttp's client
// closes its connection after every response that has no Content-Length,
// HEAD answers included (both relays send none, which RFC 9110 allows), so
// with it the HEAD figure would measure TCP handshakes; and because it is
// cheaper than any general client, which leaves more of the shared cores
// to the servers being compared.
type rawClient struct {
	conn net.Conn
	br   *bufio.Reader
	body []byte // the last response's body, reused
}

func dialRaw(addr string) (*rawClient, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawClient{conn: conn, br: bufio.NewReaderSize(conn, 16<<10)}, nil
}

func (c *rawClient) close() error { return c.conn.Close() }

// rawRequest builds the bytes of one request.
func rawRequest(method, addr, uri string) []byte {
	return []byte(method + " " + uri + " HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + token + "\r\n\r\n")
}

var (
	errMalformed   = errors.New("malformed response")
	contentLength  = []byte("content-length:")
	transferEncode = []byte("transfer-encoding:")
)

// do sends req and reads its response: the status and, unless head, the
// body (valid until the next call).
func (c *rawClient) do(req []byte, head bool) (int, []byte, error) {
	if _, err := c.conn.Write(req); err != nil {
		return 0, nil, err
	}
	return c.response(head)
}

// send writes requests (one or several, pipelined) in one write; their
// responses are read with response, one call each, in order.
func (c *rawClient) send(reqs []byte) error {
	_, err := c.conn.Write(reqs)
	return err
}

// response reads the next response: the status and, unless head, the
// body (valid until the next call). A response without Content-Length
// has an empty body; a chunked one is refused (neither relay sends one
// for these requests).
func (c *rawClient) response(head bool) (int, []byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, nil, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	n := 0
	for {
		line, err = c.br.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		if len(line) <= 2 {
			break // the blank line that ends the header
		}
		if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):]))); err != nil || n < 0 {
				return 0, nil, fmt.Errorf("%w: %q", errMalformed, line)
			}
		}
		if len(line) > len(transferEncode) && bytes.EqualFold(line[:len(transferEncode)], transferEncode) {
			return 0, nil, fmt.Errorf("%w: unexpected %q", errMalformed, line)
		}
	}
	if head {
		return status, nil, nil
	}
	if cap(c.body) < n {
		c.body = make([]byte, n)
	}
	c.body = c.body[:n]
	if _, err := io.ReadFull(c.br, c.body); err != nil {
		return 0, nil, err
	}
	return status, c.body, nil
}
