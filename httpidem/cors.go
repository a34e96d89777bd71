package httpidem

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CORSAllowHeaders are the request headers a browser must be allowed to
// send to the middleware (Access-Control-Allow-Headers): the key and
// Content-Type (a JSON body makes a request preflighted). Give them to the
// CORS library of your framework if you use one rather than [CORS].
var CORSAllowHeaders = []string{DefaultKeyHeader, "Content-Type"}

// CORSExposeHeaders are the response headers a page's script must be able
// to read (Access-Control-Expose-Headers): the replay marker, Retry-After,
// the key's expiry and the holder's lease. Without them fetch() hides
// them: a browser client cannot tell a replay, nor when to retry.
var CORSExposeHeaders = []string{DefaultReplayHeader, "Retry-After", DefaultExpiresHeader, LeaseHeader}

// CORSOptions configures [CORS].
type CORSOptions struct {
	// AllowedOrigins are the origins whose pages may call the API, each
	// scheme://host[:port] exactly ("https://shop.example"), or "*" for
	// every origin (refused with AllowCredentials). Required.
	AllowedOrigins []string
	// AllowedMethods are the methods a page may send. Default:
	// [DefaultMethods] (POST and PATCH) and GET.
	AllowedMethods []string
	// AllowedHeaders are request headers allowed besides
	// [CORSAllowHeaders] (Authorization, say).
	AllowedHeaders []string
	// ExposedHeaders are response headers exposed besides
	// [CORSExposeHeaders] (Location, say).
	ExposedHeaders []string
	// AllowCredentials lets pages send cookies and HTTP authentication.
	AllowCredentials bool
	// MaxAge is how long a browser may cache a preflight's answer.
	// Default: 10 minutes.
	MaxAge time.Duration
}

// CORS returns a net/http middleware that answers the CORS preflight of
// browsers (OPTIONS with Access-Control-Request-Method) for the allowed
// origins, allowing the Idempotency-Key header, and marks the other
// responses to those origins so that a page's script can read the replay
// marker, Retry-After and the expiry header ([CORSExposeHeaders]). Put it
// outside the idempotency middleware (cors(idem(handler))), so that the
// middleware's own answers (409, 422, replays) carry the CORS headers too.
// A preflight from another origin gets 403 and no CORS headers; another
// request from it passes through without them, and the browser keeps the
// response from the page.
//
// Header names renamed with [WithKeyHeader], [WithReplayHeader] or
// [WithExpiresHeader] go in AllowedHeaders and ExposedHeaders. CORS
// returns an error wrapping [idempotency.ErrInvalidArgument], naming the
// field, for no origins, a malformed origin, "*" with AllowCredentials, or
// an invalid method or header name.
func CORS(o CORSOptions) (func(http.Handler) http.Handler, error) {
	if len(o.AllowedOrigins) == 0 {
		return nil, invalidArg("CORSOptions.AllowedOrigins: none; name the origins of the pages that call the API")
	}
	c := &cors{origins: map[string]bool{}, credentials: o.AllowCredentials}
	for _, origin := range o.AllowedOrigins {
		if origin == "*" {
			if o.AllowCredentials {
				return nil, invalidArg("CORSOptions.AllowedOrigins: \"*\" with AllowCredentials: browsers refuse it; name the origins")
			}
			c.any = true
			continue
		}
		u, err := url.Parse(origin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
			return nil, invalidArg("CORSOptions.AllowedOrigins: %q is not an origin (scheme://host[:port], no path)", origin)
		}
		c.origins[strings.ToLower(origin)] = true
	}
	methods := o.AllowedMethods
	if methods == nil {
		methods = append(slices.Clone(DefaultMethods), http.MethodGet)
	}
	for _, m := range methods {
		if !validHeaderName(m) {
			return nil, invalidArg("CORSOptions.AllowedMethods: invalid method %q", m)
		}
	}
	allow := append(slices.Clone(CORSAllowHeaders), o.AllowedHeaders...)
	expose := append(slices.Clone(CORSExposeHeaders), o.ExposedHeaders...)
	for _, h := range append(slices.Clone(allow), expose...) {
		if !validHeaderName(h) {
			return nil, invalidArg("CORSOptions: invalid header name %q", h)
		}
	}
	c.methods, c.allow, c.expose = strings.Join(methods, ", "), strings.Join(allow, ", "), strings.Join(expose, ", ")
	maxAge := o.MaxAge
	if maxAge == 0 {
		maxAge = 10 * time.Minute
	}
	c.maxAge = strconv.Itoa(int(maxAge / time.Second))
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(next, w, r) })
	}, nil
}

type cors struct {
	origins                map[string]bool
	any, credentials       bool
	methods, allow, expose string
	maxAge                 string
}

func (c *cors) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	origin := r.Header.Get("Origin")
	if origin == "" {
		next.ServeHTTP(w, r) // not a cross-origin request from a browser
		return
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	allowed := c.any || c.origins[strings.ToLower(origin)]
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	if preflight {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		if !allowed {
			http.Error(w, "origin not allowed", http.StatusForbidden)
			return
		}
		c.allowOrigin(h, origin)
		h.Set("Access-Control-Allow-Methods", c.methods)
		h.Set("Access-Control-Allow-Headers", c.allow)
		h.Set("Access-Control-Max-Age", c.maxAge)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if allowed {
		c.allowOrigin(h, origin)
		h.Set("Access-Control-Expose-Headers", c.expose)
	}
	next.ServeHTTP(w, r)
}

func (c *cors) allowOrigin(h http.Header, origin string) {
	if c.any {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if c.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}
