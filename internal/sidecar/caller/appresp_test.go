package caller

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAnswer: the direct client's answers read in place are what
// net/http reads of them (status, HCP-Batch-Max and HCP-Stream, the first
// 512 bytes of the body, whether the connection is kept, where the next
// answer starts), for plain answers and for every kind left to net/http,
// whole in the buffer or arriving a byte at a time.
func TestReadAnswer(t *testing.T) {
	long := strings.Repeat("y", 1000)
	for _, raw := range []string{
		"HTTP/1.1 204 No Content\r\nHcp-Batch-Max: 100\r\nDate: Mon, 30 Nov 2026 03:00:00 GMT\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nHCP-Stream: 1\r\n\r\nok",
		"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + long,
		"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nboom\n",
		"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nConnection: keep-alive, Close\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n",
		"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nxxxxx",
		"HTTP/1.1 204 No Content\r\nHcp-Batch-Max:\t 7 \r\nHcp-Batch-Max: 9\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\nHcp-Batch-Max: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
		"HTTP/1.1 200 OK\r\n\r\nuntil the close",
		"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("z", 100000),
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 20x OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
		"FOO\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",
		"",
	} {
		for _, next := range []string{"", "HTTP/1.1 204 No Content\r\n\r\n"} {
			for _, slow := range []bool{false, true} {
				in := raw + next
				var src io.Reader = strings.NewReader(in)
				if slow {
					src = iotest.OneByteReader(src)
				}
				fast, fkeep, ferr := (&appConn{}).readAnswer(bufio.NewReaderSize(src, 4096))
				// What net/http reads of it, the rest left in the reader.
				wr := bufio.NewReaderSize(strings.NewReader(in), 4096)
				want, wkeep, werr := readAnswerHTTP(wr)
				wrest, _ := io.ReadAll(wr)
				fr := bufio.NewReaderSize(strings.NewReader(in), 4096)
				_, _, _ = (&appConn{}).readAnswer(fr)
				frest, _ := io.ReadAll(fr)
				name := strings.ReplaceAll(in, "\r\n", "|")
				if len(name) > 100 {
					name = name[:100]
				}
				switch {
				case (ferr == nil) != (werr == nil):
					t.Errorf("%q (byte at a time %v): error %v, net/http's %v", name, slow, ferr, werr)
				case ferr != nil:
				case fast.code != want.code || fkeep != wkeep || !bytes.Equal(fast.msg, want.msg) ||
					(fast.code/100 != 2 && fast.status != want.status):
					t.Errorf("%q (byte at a time %v):\n got %d %q keep %v msg %q\nwant %d %q keep %v msg %q",
						name, slow, fast.code, fast.status, fkeep, fast.msg, want.code, want.status, wkeep, want.msg)
				case fast.header.Get(HeaderBatchMax) != want.header.Get(HeaderBatchMax) ||
					fast.header.Get(HeaderStream) != want.header.Get(HeaderStream):
					t.Errorf("%q: header %v, net/http's %v", name, fast.header, want.header)
				case wkeep && string(frest) != string(wrest):
					t.Errorf("%q: %q left for the next answer, net/http leaves %q", name, frest, wrest)
				}
			}
		}
	}
}

// TestReadAnswerInPlace: a plain answer costs no allocation while the app
// says the same of batches and streams.
func TestReadAnswerInPlace(t *testing.T) {
	raw := []byte("HTTP/1.1 204 No Content\r\nHcp-Batch-Max: 100\r\nDate: Mon, 30 Nov 2026 03:00:00 GMT\r\n\r\n")
	c := &appConn{}
	rd := bytes.NewReader(raw)
	br := bufio.NewReaderSize(rd, 4096)
	read := func() {
		rd.Reset(raw)
		br.Reset(rd)
		resp, keep, err := c.readAnswer(br)
		if err != nil || !keep || resp.code != http.StatusNoContent || resp.header[canonBatchMax][0] != "100" {
			t.Fatalf("%+v %v %v", resp, keep, err)
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Errorf("%v allocations per answer, want 0", n)
	}
}
