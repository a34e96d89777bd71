package browser_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/memory"
)

// chromium returns the browser's binary: IDEM_CHROMIUM, or chromium on
// the PATH. Without one the test fails: it is a real-browser test.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium: `make test` installs it (scripts/servers/chromium.sh: apt-get install chromium), or set IDEM_CHROMIUM")
	return ""
}

// page is the shop's page, served from its own origin: pay() sends one
// intent with one key, retrying while the answer asks for it (5xx, 409),
// then sends it once more (a double click), and reports what the script
// could read.
const page = `<!doctype html><title>shop</title><script>
async function pay(api) {
  const key = crypto.randomUUID();
  const send = () => fetch(api + "/payments", {method: "POST",
    headers: {"Idempotency-Key": key, "Content-Type": "application/json"},
    body: JSON.stringify({amount: 42})});
  const statuses = [];
  let r, retryAfter = null;
  for (let i = 0; i < 10; i++) {
    r = await send();
    statuses.push(r.status);
    if (r.status >= 500) retryAfter = r.headers.get("Retry-After");
    if (r.status < 500 && r.status !== 409) break;
    await new Promise(ok => setTimeout(ok, 50));
  }
  const first = await r.text();
  const again = await send(); // the double click
  return JSON.stringify({statuses, first, second: await again.text(), secondStatus: again.status,
    replayed: again.headers.get("Idempotent-Replayed"),
    expires: again.headers.get("Idempotency-Key-Expires"),
    retryAfter});
}
</script>`

func TestBrowserCrossOriginRetryAndReplay(t *testing.T) {
	bin := chromium(t)
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(runner, httpidem.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, page)
	}))
	defer shop.Close()
	cors, err := httpidem.CORS(httpidem.CORSOptions{AllowedOrigins: []string{shop.URL}})
	if err != nil {
		t.Fatal(err)
	}
	var attempts, charges, preflights atomic.Int64
	api := httptest.NewServer(countPreflights(&preflights, cors(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) == 1 {
			// The first attempt fails and asks for a retry: released.
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"pay_%d"}`, n)
	})))))
	defer api.Close()

	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU)...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(shop.URL)); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	out, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf("pay(%q)", api.URL), chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	var got struct {
		Statuses          []int
		First, Second     string
		SecondStatus      int
		Replayed, Expires string
		RetryAfter        string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("page said %q: %v", out, err)
	}
	t.Logf("the page read: %s; preflights %d", out, preflights.Load())
	switch {
	case fmt.Sprint(got.Statuses) != "[503 201]":
		t.Fatalf("statuses %v, want a 503 then the 201", got.Statuses)
	case got.SecondStatus != 201 || got.Second != got.First || got.First != `{"payment":"pay_1"}`:
		t.Fatalf("second send %d %q, want the first 201 %q replayed", got.SecondStatus, got.Second, got.First)
	case got.Replayed != "true":
		t.Fatalf("the script read Idempotent-Replayed %q, want \"true\" (exposed by CORS)", got.Replayed)
	case got.Expires == "":
		t.Fatal("the script could not read Idempotency-Key-Expires")
	case got.RetryAfter != "1":
		t.Fatalf("the script read Retry-After %q on the 503, want \"1\"", got.RetryAfter)
	case charges.Load() != 1 || preflights.Load() == 0:
		t.Fatalf("%d charges, %d preflights; want 1 charge and a preflight", charges.Load(), preflights.Load())
	}
	if _, err := http.ParseTime(got.Expires); err != nil {
		t.Fatalf("expiry %q: %v", got.Expires, err)
	}
}

func countPreflights(n *atomic.Int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			n.Add(1)
		}
		next.ServeHTTP(w, r)
	})
}
