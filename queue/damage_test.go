package queue_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/exactlyonce/idempotency/queue"
)

// flip changes the byte at every occurrence of marker+off in file (bbolt
// may keep stale copies in free pages; the live one is among them).
func flip(t *testing.T, file, marker string, off int) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 0; ; {
		j := bytes.Index(data[i:], []byte(marker))
		if j < 0 {
			break
		}
		data[i+j+off] ^= 0x55
		i += j + len(marker)
		n++
	}
	if n == 0 {
		t.Fatalf("%q not in %s", marker, file)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A damaged byte in an item's request is found by its checksum: the item
// is listed as damaged and never sent, later items of its order wait
// behind it (never reordered), other orders go on, and dropping it lets
// its order go on.
func TestDamagedBody(t *testing.T) {
	srv, l := idemServer(t, created)
	file := filepath.Join(t.TempDir(), "q")
	q := openAt(t, file)
	var keys []string
	for i, o := range []string{"a", "a", "a", "b"} {
		keys = append(keys, enqueue(t, q, post(t, srv, fmt.Sprintf(`{"marker":"M%d-%s"}`, i, strings.Repeat("x", 40)), "X-Order", o), queue.InOrder(o)))
	}
	q.Close()
	flip(t, file, `M1-`, 5)

	var got ends
	q = openAt(t, file, queue.WithOnDone(got.handler))
	items, err := q.List(queue.Pending, 0, 0)
	if err != nil || len(items) != 4 {
		t.Fatalf("List: %d items, %v", len(items), err)
	}
	for i, it := range items {
		if (it.Damaged != nil) != (i == 1) || it.Key != keys[i] {
			t.Errorf("item %d: key %s, damaged %v", i, it.Key, it.Damaged)
		}
	}
	if d := items[1].Damaged; !errors.Is(d, queue.ErrCorrupt) || !strings.Contains(d.Error(), "item 2") {
		t.Errorf("damage: %v, want ErrCorrupt naming item 2", d)
	}
	runUntil(t, q, func() bool { return got.len() == 2 })
	if err := q.Retry(keys[1]); !errors.Is(err, queue.ErrCorrupt) {
		t.Errorf("Retry of a damaged item: %v, want ErrCorrupt", err)
	}
	sent := func() string {
		var s []string
		for _, e := range l.all() {
			s = append(s, e.key)
		}
		return strings.Join(s, " ")
	}
	if want := keys[0] + " " + keys[3]; sent() != want {
		t.Fatalf("sent %s, want items 1 and 4 only", sent())
	}
	if err := q.Drop(keys[1]); err != nil {
		t.Fatal(err)
	}
	runUntil(t, q, func() bool { return got.len() == 3 })
	if want := keys[0] + " " + keys[3] + " " + keys[2]; sent() != want {
		t.Errorf("sent %s, want items 1, 4, 3", sent())
	}
}

// A damaged head (the item's key, order...) leaves the item's order
// unknown: every later item waits until it is dropped by its ID.
func TestDamagedHead(t *testing.T) {
	srv, l := idemServer(t, created)
	file := filepath.Join(t.TempDir(), "q")
	q := openAt(t, file)
	var keys []string
	for i, o := range []string{"a", "b", "c"} {
		keys = append(keys, enqueue(t, q, post(t, srv, fmt.Sprintf(`{"n":%d}`, i)), queue.InOrder(o)))
	}
	q.Close()
	flip(t, file, keys[1], 3)

	var got ends
	q = openAt(t, file, queue.WithOnDone(got.handler))
	items, err := q.List(queue.Pending, 0, 0)
	if err != nil || len(items) != 3 || items[1].Damaged == nil || items[1].Key != "" || items[0].Damaged != nil || items[2].Damaged != nil {
		t.Fatalf("List: %+v, %v", items, err)
	}
	runUntil(t, q, func() bool { return got.len() == 1 })
	if e := l.all(); len(e) != 1 || e[0].key != keys[0] {
		t.Fatalf("effects %+v, want item 1 only", e)
	}
	if err := q.DropID(items[1].ID); err != nil {
		t.Fatal(err)
	}
	runUntil(t, q, func() bool { return got.len() == 2 })
	if e := l.all(); len(e) != 2 || e[1].key != keys[2] {
		t.Errorf("effects %+v, want items 1 and 3", e)
	}
}

// A file that is not a queue, or whose index is damaged, gives a clear
// error at Open, never a crash; a damaged page of the requests' bodies
// leaves the items on it damaged and the others readable.
func TestDamagedFile(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a queue "), 2000), 0o600)

	// A queue of 40 items, whose pages are then overwritten.
	good := filepath.Join(dir, "good")
	q, err := queue.Open(good)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 40 {
		key, err := q.Enqueue(post(t, "http://example.test/x", fmt.Sprintf(`{"marker":"P%03d-%s"}`, i, strings.Repeat("y", 500))))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	q.Close()
	data, _ := os.ReadFile(good)
	damagePage := func(name, marker string) string {
		// Every page with the marker: stale copies in free pages too, as
		// the live one may be any of them.
		d := bytes.Clone(data)
		for i := 0; ; {
			j := bytes.Index(data[i:], []byte(marker))
			if j < 0 {
				break
			}
			page := (i + j) &^ (os.Getpagesize() - 1)
			copy(d[page:page+16], bytes.Repeat([]byte{0xee}, 16))
			i += j + len(marker)
		}
		f := filepath.Join(dir, name)
		os.WriteFile(f, d, 0o600)
		return f
	}
	heads := damagePage("heads", keys[20])
	bodies := damagePage("bodies", "P020-")
	truncated := filepath.Join(dir, "truncated")
	os.WriteFile(truncated, data[:len(data)/3], 0o600)

	for _, f := range []string{garbage, heads, truncated} {
		for range 2 { // the second finds the file unlocked: Open closed it
			q, err := queue.Open(f)
			if err == nil {
				q.Close()
			}
			if !errors.Is(err, queue.ErrCorrupt) || !strings.Contains(err.Error(), f) {
				t.Errorf("Open(%s): %v, want ErrCorrupt naming the file", filepath.Base(f), err)
			}
		}
	}

	q = openAt(t, bodies)
	items, err := q.List(queue.Pending, 0, 0)
	if err != nil || len(items) != 40 {
		t.Fatalf("List: %d items, %v", len(items), err)
	}
	damaged := 0
	for i, it := range items {
		if it.Damaged != nil {
			damaged++
			if !errors.Is(it.Damaged, queue.ErrCorrupt) {
				t.Errorf("item %d: %v, want ErrCorrupt", i, it.Damaged)
			}
		} else if it.Key != keys[i] {
			t.Errorf("item %d: key %s, want %s", i, it.Key, keys[i])
		}
	}
	if damaged == 0 || damaged > 10 || items[20].Damaged == nil {
		t.Errorf("%d damaged items (item 21: %v), want the few on the page", damaged, items[20].Damaged)
	}
}

// A full disk (here a file size limit, RLIMIT_FSIZE, in a child process):
// Enqueue fails with a clear error, nothing it did not acknowledge is
// stored, and every acknowledged item is there after a restart.
func TestFullDisk(t *testing.T) {
	file := filepath.Join(t.TempDir(), "q")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QUEUE_TEST_CHILD=fsize", "QUEUE_TEST_FILE="+file)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var acked []string
	var failure, after string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 2)
		switch f[0] {
		case "ACK":
			acked = append(acked, f[1])
		case "ERR":
			failure = f[1]
		case "AFTER":
			after = f[1]
		}
	}
	if len(acked) < 10 || !strings.Contains(failure, "not stored") || !strings.Contains(failure, "file too large") {
		t.Fatalf("%d acknowledged, then %q; want some, then a clear error\n%s", len(acked), failure, out)
	}
	if after != fmt.Sprintf("pending=%d listed=%d", len(acked), len(acked)) {
		t.Errorf("in the child after the failure: %s, want %d pending and listed", after, len(acked))
	}
	q := openAt(t, file)
	items, err := q.List(queue.Pending, 0, 0)
	if err != nil || len(items) != len(acked) {
		t.Fatalf("after a restart: %d items, %v; want the %d acknowledged", len(items), err, len(acked))
	}
	for i, it := range items {
		if it.Key != acked[i] || it.Damaged != nil {
			t.Errorf("item %d: key %s, damaged %v; want %s", i, it.Key, it.Damaged, acked[i])
		}
	}
	if _, err := q.Enqueue(post(t, "http://example.test/x", "{}")); err != nil {
		t.Errorf("Enqueue with room again: %v", err)
	}
}

// fsizeChild enqueues 1 KiB requests under a 256 KiB file size limit
// until Enqueue fails, then tries a few more and lists the queue.
func fsizeChild() {
	lim := syscall.Rlimit{Cur: 256 << 10, Max: 256 << 10}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fmt.Println("FATAL", err)
		os.Exit(1)
	}
	q, err := queue.Open(os.Getenv("QUEUE_TEST_FILE"))
	if err != nil {
		fmt.Println("FATAL", err)
		os.Exit(1)
	}
	body := `{"pad":"` + strings.Repeat("z", 1000) + `"}`
	failed := 0
	for i := 0; i < 2000 && failed < 5; i++ {
		req, _ := http.NewRequest("POST", "http://example.test/x", strings.NewReader(body))
		key, err := q.Enqueue(req)
		if err != nil {
			if failed == 0 {
				fmt.Println("ERR", strconv.Quote(err.Error()))
			}
			failed++
			continue
		}
		if failed > 0 {
			fmt.Println("FATAL an Enqueue succeeded after the disk was full")
		}
		fmt.Println("ACK", key)
	}
	p, _, err := q.Len()
	items, err2 := q.List(queue.Pending, 0, 0)
	fmt.Printf("AFTER pending=%d listed=%d\n", p, len(items))
	if err != nil || err2 != nil {
		fmt.Println("FATAL", err, err2)
	}
	q.Close()
}
