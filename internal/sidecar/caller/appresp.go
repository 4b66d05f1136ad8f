package caller

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// readAnswer reads the app's answer to one request from br and reports
// whether the connection may carry the next one. An error means no answer
// (no status line and headers); a body cut short only costs the
// connection.
//
// A plain answer, the app's every answer at a steady stream (HTTP/1.1, a
// status of 2xx to 5xx, a Content-Length of at most 64 KiB or none on a
// 204 or 304, no Transfer-Encoding, no folded or malformed header line),
// is parsed where it lies in br's buffer: net/http's ReadResponse
// allocated a Response, a header map, a string per header line and a body
// reader per answer, about a tenth of the caller sidecar's allocations.
// Anything else, or an answer whose headers are not yet all in the
// buffer, goes to ReadResponse (readAnswerHTTP), which reads it from
// where it starts: the fast path consumes nothing until it is sure.
func (c *appConn) readAnswer(br *bufio.Reader) (appResponse, bool, error) {
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // as ReadResponse words it
		}
		return appResponse{}, false, err
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return readAnswerHTTP(br)
	}
	h, ok := parseHead(buf[:end+2])
	if !ok {
		return readAnswerHTTP(br)
	}
	out := appResponse{code: h.code, header: c.offerHeader(h.batchMax, h.stream)}
	if h.code < 200 || h.code > 299 {
		out.status = string(h.status) // only a refusal's error shows it
	}
	_, _ = br.Discard(end + 4) // buffered: cannot fail
	if h.length > 0 {
		out.msg = make([]byte, min(h.length, 512))
		n, err := io.ReadFull(br, out.msg)
		out.msg = out.msg[:n]
		if err != nil {
			return out, false, nil
		}
		if _, err := br.Discard(h.length - len(out.msg)); err != nil {
			return out, false, nil
		}
	}
	return out, !h.close, nil
}

// head is what readAnswer takes from a plain answer's status line and
// headers.
type head struct {
	code             int
	status           []byte // "200 OK"
	length           int
	close            bool
	batchMax, stream []byte
}

// parseHead parses a plain answer's status line and header lines (each
// ending in CRLF); false for anything else (see readAnswer).
func parseHead(b []byte) (head, bool) {
	var h head
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	if len(line) < 12 || string(line[:9]) != "HTTP/1.1 " || (len(line) > 12 && line[12] != ' ') {
		return h, false
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 200 || code > 599 {
		return h, false
	}
	h.code, h.status, h.length = code, line[9:], -1
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !validHeaderName(name) {
			return h, false
		}
		value = bytes.Trim(value, " \t")
		switch {
		case headerIs(name, "Content-Length"):
			n, err := strconv.ParseUint(string(value), 10, 32)
			if err != nil || n > 64<<10 || h.length >= 0 {
				return h, false
			}
			h.length = int(n)
		case headerIs(name, "Transfer-Encoding"):
			return h, false
		case headerIs(name, "Connection"):
			h.close = h.close || connectionCloses(value)
		case headerIs(name, HeaderBatchMax):
			if h.batchMax == nil {
				h.batchMax = value
			}
		case headerIs(name, HeaderStream):
			if h.stream == nil {
				h.stream = value
			}
		}
	}
	switch {
	case code == http.StatusNoContent || code == http.StatusNotModified:
		h.length = 0 // no body, whatever the headers say (as net/http reads it)
	case h.length < 0:
		return h, false // a body up to the close
	}
	return h, true
}

// The header names offerHeader sets, in canonical form.
var (
	canonBatchMax = http.CanonicalHeaderKey(HeaderBatchMax)
	canonStream   = http.CanonicalHeaderKey(HeaderStream)
)

// headerIs reports whether a header line's name is name, in any case.
func headerIs(b []byte, name string) bool {
	return len(b) == len(name) && bytes.EqualFold(b, []byte(name))
}

// connectionCloses reports whether a Connection header's value has the
// token "close".
func connectionCloses(v []byte) bool {
	for tok := range bytes.SplitSeq(v, []byte(",")) {
		if bytes.EqualFold(bytes.Trim(tok, " \t"), []byte("close")) {
			return true
		}
	}
	return false
}

// validHeaderName reports whether name is an HTTP token (no folding, no
// space before the colon).
func validHeaderName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), c) >= 0 {
			return false
		}
	}
	return true
}

// offerHeader is the header post reads of a plain answer: HCP-Batch-Max
// and HCP-Stream, the rest left out. The last one is kept and given again
// while the app says the same (a header map per answer otherwise): it is
// only read.
func (c *appConn) offerHeader(batchMax, stream []byte) http.Header {
	if c.offers != nil && string(batchMax) == c.offers.Get(canonBatchMax) && string(stream) == c.offers.Get(canonStream) &&
		(batchMax == nil) == (c.offers[canonBatchMax] == nil) && (stream == nil) == (c.offers[canonStream] == nil) {
		return c.offers
	}
	h := make(http.Header, 2)
	if batchMax != nil {
		h[canonBatchMax] = []string{string(batchMax)}
	}
	if stream != nil {
		h[canonStream] = []string{string(stream)}
	}
	c.offers = h
	return h
}

// readAnswerHTTP reads an answer with net/http (see readAnswer): interim
// answers (103 Early Hints, say) are skipped, as net/http's client skips
// them, and the body is read up to 64 KiB so that the connection can be
// used again; an answer longer than that closes it.
func readAnswerHTTP(br *bufio.Reader) (appResponse, bool, error) {
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode <= 199 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		return appResponse{}, false, err
	}
	out := appResponse{status: resp.Status, code: resp.StatusCode, header: resp.Header}
	out.msg, err = io.ReadAll(io.LimitReader(resp.Body, 512))
	if err == nil {
		var n int64
		n, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10+1))
		if err == nil && n > 64<<10 {
			resp.Close = true
		}
	}
	if err != nil || resp.Close || resp.ProtoMajor != 1 || resp.ProtoMinor < 1 {
		return out, false, nil
	}
	return out, true, nil
}
