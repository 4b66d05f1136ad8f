package callee

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// apiCall matches, by the text of a call's function, what goes to the API
// server or the harness over the network: the clients' reads and writes,
// the optimistic-lock status write, checkpoint reads and writes, status
// flushes, pod checks and HTTP requests.
var apiCall = regexp.MustCompile(`(^|\.)(c|reader|cl|kc)\.(Get|List|Create|Update|Patch|Delete|Status)$|` +
	`(^|\.)(casStatus|podAlive|ownerAlive|callHarness|postHarness|Flush)$|` +
	`(^|\.)ckpt\.[A-Z]|(^|\.)http\.[A-Z]|\.Do$`)

// TestNoAPICallUnderSessionLock reads this package's source and fails if a
// call to the API server or the harness is made while a session's lock is
// held: in a *Locked function (called with the lock), or between
// ss.acquire and ss.release (to the end of the function after a deferred
// release), directly or through a function of this package that makes one.
// Goroutines started there are not under the lock. A slow API server or
// harness must never hold up a session's events, aborts and timeouts.
func TestNoAPICallUnderSessionLock(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var decls []*ast.FuncDecl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				decls = append(decls, fd)
			}
		}
	}
	// The functions that call the network directly (outside goroutines).
	direct := map[string]bool{}
	for _, fd := range decls {
		eachCall(fd.Body, func(c *ast.CallExpr) {
			if apiCall.MatchString(callee(c)) {
				direct[fd.Name.Name] = true
			}
		})
	}
	forbidden := func(c *ast.CallExpr) bool {
		name := callee(c)
		if apiCall.MatchString(name) {
			return true
		}
		base := name[strings.LastIndex(name, ".")+1:]
		return direct[base] && !strings.HasSuffix(base, "Locked")
	}
	var bad []string
	checked := 0
	for _, fd := range decls {
		regions := lockedRegions(fd)
		if len(regions) == 0 {
			continue
		}
		checked++
		eachCall(fd.Body, func(c *ast.CallExpr) {
			for _, r := range regions {
				if c.Pos() >= r[0] && c.Pos() < r[1] && forbidden(c) {
					bad = append(bad, fset.Position(c.Pos()).String()+": "+fd.Name.Name+" calls "+callee(c)+" with the session lock held")
				}
			}
		})
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
	if checked < 10 {
		t.Fatalf("only %d functions hold the session lock; the audit is not finding them", checked)
	}
	t.Logf("%d functions hold a session's lock; %d functions call the network directly", checked, len(direct))
}

// lockedRegions returns the source ranges of fd run with a session's lock
// held.
func lockedRegions(fd *ast.FuncDecl) [][2]token.Pos {
	if strings.HasSuffix(fd.Name.Name, "Locked") {
		return [][2]token.Pos{{fd.Body.Pos(), fd.Body.End()}}
	}
	var out [][2]token.Pos
	var open token.Pos
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt, *ast.FuncLit:
			return false
		case *ast.DeferStmt:
			if strings.HasSuffix(callee(n.Call), ".release") && open.IsValid() {
				out = append(out, [2]token.Pos{open, fd.Body.End()})
				open = token.NoPos
			}
			return false
		case *ast.CallExpr:
			switch name := callee(n); {
			case strings.HasSuffix(name, ".acquire") && !open.IsValid():
				open = n.Pos()
			case strings.HasSuffix(name, ".release") && open.IsValid():
				out = append(out, [2]token.Pos{open, n.Pos()})
				open = token.NoPos
			}
		}
		return true
	})
	if open.IsValid() { // released on another path; assume to the end
		out = append(out, [2]token.Pos{open, fd.Body.End()})
	}
	return out
}

// eachCall calls f for every call in n, not descending into goroutines.
func eachCall(n ast.Node, f func(*ast.CallExpr)) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			return false
		case *ast.CallExpr:
			f(n)
		}
		return true
	})
}

// callee renders a call's function as text: "ss.sc.c.Get", "casStatus".
func callee(c *ast.CallExpr) string {
	var b strings.Builder
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		switch e := e.(type) {
		case *ast.Ident:
			b.WriteString(e.Name)
		case *ast.SelectorExpr:
			walk(e.X)
			b.WriteString("." + e.Sel.Name)
		case *ast.CallExpr:
			walk(e.Fun)
			b.WriteString("()")
		case *ast.IndexExpr:
			walk(e.X)
		case *ast.ParenExpr:
			walk(e.X)
		case *ast.StarExpr:
			walk(e.X)
		}
	}
	walk(c.Fun)
	return b.String()
}
