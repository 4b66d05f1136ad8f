// Package config is the contract between the operator, which renders the
// hcp-sidecar container, and the sidecar, which reads it: environment
// variable names, defaults and parsing. Both sides import it, so the pod spec
// and the binary cannot drift apart.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Mode is the sidecar's role.
type Mode string

// Sidecar modes.
const (
	ModeCallee Mode = "callee"
	ModeCaller Mode = "caller"
)

// Environment variables of the hcp-sidecar container.
const (
	EnvMode                = "HCP_MODE"                   // callee or caller
	EnvID                  = "HCP_ID"                     // callee or caller id
	EnvObjectName          = "HCP_OBJECT_NAME"            // name of the Callee or Caller object
	EnvNamespace           = "HCP_NAMESPACE"              // namespace (downward API)
	EnvPodName             = "HCP_POD_NAME"               // pod name (downward API)
	EnvVhost               = "HCP_VHOST"                  // AMQP vhost
	EnvAMQPURL             = "HCP_AMQP_URL"               // amqp(s)://user:pass@host:port/vhost (local runs; pods use EnvAMQPURLFile)
	EnvAMQPURLFile         = "HCP_AMQP_URL_FILE"          // file holding the URL: the mounted credentials Secret's uri, reread on each dial
	EnvAMQPAddresses       = "HCP_AMQP_ADDRESSES"         // optional: the broker nodes, HOST:PORT,HOST:PORT,…, tried in turn instead of the URL's host
	EnvUsername            = "HCP_USERNAME"               // broker username (the user_id set on every publish)
	EnvTokenKey            = "HCP_TOKEN_KEY"              // callee: PEM PKCS#8 Ed25519 private key (local runs; pods use EnvTokenKeyFile)
	EnvTokenKeyFile        = "HCP_TOKEN_KEY_FILE"         // callee: file holding it: private.pem of the mounted credentials Secret, followed on rotation
	EnvTokenVerifyKeysFile = "HCP_TOKEN_VERIFY_KEYS_FILE" // callee: PEM public keys accepted on abort tokens (current and retired), followed on rotation
	EnvHarnessURL          = "HCP_HARNESS_URL"            // callee: base URL of the harness; caller: base URL of the app
	EnvAPIAddr             = "HCP_API_ADDR"               // listen address of the local harness API
	EnvProbeAddr           = "HCP_PROBE_ADDR"             // listen address of /healthz, /readyz, /metrics
	EnvPrefetch            = "HCP_PREFETCH"               // basic.qos prefetch count
	EnvAppMaxBatch         = "HCP_APP_MAX_BATCH"          // caller: events per POST to the app (1: one per request)
	EnvAppMaxAttempts      = "HCP_APP_MAX_ATTEMPTS"       // caller: refusals of an event by the app before it is dead-lettered
	EnvAppStream           = "HCP_APP_STREAM"             // caller: true: every delivery goes over one stream to the app (POST /hcp/v1/events/stream)
	EnvHeartbeat           = "HCP_HEARTBEAT"              // AMQP heartbeat (Go duration)
	EnvTLSCAFile           = "HCP_TLS_CA_FILE"            // CA bundle for amqps
	EnvTLSCertFile         = "HCP_TLS_CERT_FILE"          // client certificate for amqps
	EnvTLSKeyFile          = "HCP_TLS_KEY_FILE"           // client key for amqps
	EnvLogLevel            = "HCP_LOG_LEVEL"              // debug, info or error
	EnvStateDir            = "HCP_STATE_DIR"              // caller: where last_processed_sequence is persisted
)

// Defaults.
const (
	DefaultAPIAddr        = "127.0.0.1:9090"
	DefaultProbeAddr      = ":9091"
	DefaultAPIPort        = 9090
	DefaultProbePort      = 9091
	DefaultCalleePrefetch = 10
	DefaultCallerPrefetch = 10
	// MaxAppBatch bounds HCP_APP_MAX_BATCH.
	MaxAppBatch      = 1000
	DefaultHeartbeat = 30 * time.Second
	DefaultStateDir  = "/var/lib/hcp"
	DefaultLogLevel  = "info"
)

// Config is the parsed sidecar configuration.
type Config struct {
	Mode       Mode
	ID         string
	ObjectName string
	Namespace  string
	PodName    string
	Vhost      string
	AMQPURL    string
	// AMQPURLFile, when set, holds the URL instead of AMQPURL.
	AMQPURLFile string
	// AMQPAddresses are the broker nodes to dial instead of the URL's
	// host (empty: the URL's host).
	AMQPAddresses []string
	Username      string
	TokenKeyPEM   string
	// TokenKeyFile, when set, holds the key instead of TokenKeyPEM.
	TokenKeyFile string
	// TokenVerifyKeysFile optionally holds the public keys accepted when
	// verifying tokens; the signing key's own is always accepted.
	TokenVerifyKeysFile string
	HarnessURL          string
	APIAddr             string
	ProbeAddr           string
	Prefetch            int
	// AppMaxBatch (caller mode): up to this many ready events of a session
	// go to the app in one request (POST /hcp/v1/events/batch); 1 posts
	// each to /hcp/v1/events.
	AppMaxBatch int
	// AppMaxAttempts (caller mode): after this many refusals by the app an
	// event is dead-lettered (0: the caller sidecar's default).
	AppMaxAttempts int
	Heartbeat      time.Duration
	TLSCAFile      string
	TLSCertFile    string
	TLSKeyFile     string
	LogLevel       string
	StateDir       string
	// AppStream (caller mode): every delivery (one message or a batch)
	// goes to the app as a line of one long-lived NDJSON request (POST
	// /hcp/v1/events/stream), acked line by line; false leaves it to the
	// app's offer (the HCP-Stream answer header).
	AppStream bool
}

// FromEnv reads the configuration from the environment (lookup is os.LookupEnv
// in production, a map in tests) and validates it, naming every problem.
func FromEnv(lookup func(string) (string, bool)) (*Config, error) {
	get := func(k, def string) string {
		if v, ok := lookup(k); ok && v != "" {
			return v
		}
		return def
	}
	c := &Config{
		Mode:                Mode(get(EnvMode, "")),
		ID:                  get(EnvID, ""),
		Namespace:           get(EnvNamespace, ""),
		PodName:             get(EnvPodName, ""),
		Vhost:               get(EnvVhost, "/hcp"),
		AMQPURL:             get(EnvAMQPURL, ""),
		AMQPURLFile:         get(EnvAMQPURLFile, ""),
		Username:            get(EnvUsername, ""),
		TokenKeyPEM:         get(EnvTokenKey, ""),
		TokenKeyFile:        get(EnvTokenKeyFile, ""),
		TokenVerifyKeysFile: get(EnvTokenVerifyKeysFile, ""),
		HarnessURL:          get(EnvHarnessURL, ""),
		APIAddr:             get(EnvAPIAddr, DefaultAPIAddr),
		ProbeAddr:           get(EnvProbeAddr, DefaultProbeAddr),
		TLSCAFile:           get(EnvTLSCAFile, ""),
		TLSCertFile:         get(EnvTLSCertFile, ""),
		TLSKeyFile:          get(EnvTLSKeyFile, ""),
		LogLevel:            get(EnvLogLevel, DefaultLogLevel),
		StateDir:            get(EnvStateDir, DefaultStateDir),
	}
	c.ObjectName = get(EnvObjectName, c.ID)
	var errs []error
	switch c.Mode {
	case ModeCallee, ModeCaller:
	default:
		errs = append(errs, fmt.Errorf("%s must be %q or %q, got %q", EnvMode, ModeCallee, ModeCaller, c.Mode))
	}
	for k, v := range map[string]string{EnvID: c.ID, EnvNamespace: c.Namespace, EnvUsername: c.Username, EnvHarnessURL: c.HarnessURL} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", k))
		}
	}
	if err := oneOf(EnvAMQPURL, c.AMQPURL, EnvAMQPURLFile, c.AMQPURLFile); err != nil {
		errs = append(errs, err)
	}
	if c.Mode == ModeCallee {
		if err := oneOf(EnvTokenKey, c.TokenKeyPEM, EnvTokenKeyFile, c.TokenKeyFile); err != nil {
			errs = append(errs, fmt.Errorf("callee mode: %w", err))
		}
	}
	addrs, err := ParseAMQPAddresses(get(EnvAMQPAddresses, ""))
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", EnvAMQPAddresses, err))
	}
	c.AMQPAddresses = addrs
	if c.AMQPURL != "" {
		if err := CheckAMQPURL(c.AMQPURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvAMQPURL, err))
		}
	}
	def := DefaultCalleePrefetch
	if c.Mode == ModeCaller {
		def = DefaultCallerPrefetch
	}
	p, err := strconv.Atoi(get(EnvPrefetch, strconv.Itoa(def)))
	if err != nil || p < 1 || p > 100 {
		errs = append(errs, fmt.Errorf("%s must be an integer in 1..100", EnvPrefetch))
	}
	c.Prefetch = p
	mb, err := strconv.Atoi(get(EnvAppMaxBatch, "1"))
	if err != nil || mb < 1 || mb > MaxAppBatch {
		errs = append(errs, fmt.Errorf("%s must be an integer in 1..%d", EnvAppMaxBatch, MaxAppBatch))
	}
	c.AppMaxBatch = mb
	if v := get(EnvAppMaxAttempts, ""); v != "" {
		ma, err := strconv.Atoi(v)
		if err != nil || ma < 1 || ma > 1000 {
			errs = append(errs, fmt.Errorf("%s must be an integer in 1..1000", EnvAppMaxAttempts))
		}
		c.AppMaxAttempts = ma
	}
	if v := get(EnvAppStream, ""); v != "" {
		st, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s must be true or false", EnvAppStream))
		}
		c.AppStream = st
	}
	hb, err := time.ParseDuration(get(EnvHeartbeat, DefaultHeartbeat.String()))
	if err != nil || hb < 0 {
		errs = append(errs, fmt.Errorf("%s must be a non-negative Go duration such as 30s", EnvHeartbeat))
	}
	c.Heartbeat = hb
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, fmt.Errorf("%s and %s must be set together", EnvTLSCertFile, EnvTLSKeyFile))
	}
	return c, errors.Join(errs...)
}

// oneOf requires exactly one of a value and the file that holds it.
func oneOf(env, v, fileEnv, file string) error {
	switch {
	case v == "" && file == "":
		return fmt.Errorf("%s (or %s) is required", fileEnv, env)
	case v != "" && file != "":
		return fmt.Errorf("set %s or %s, not both", fileEnv, env)
	}
	return nil
}

// CheckAMQPURL checks that u is an amqp:// or amqps:// URL. The message
// never quotes u, which holds a password.
func CheckAMQPURL(u string) error {
	p, err := url.Parse(strings.TrimSpace(u))
	if err != nil || (p.Scheme != "amqp" && p.Scheme != "amqps") || p.Host == "" {
		return errors.New("must be an amqp:// or amqps:// URL with a host")
	}
	return nil
}

// ParseAMQPAddresses parses a comma-separated list of broker nodes,
// "host1:5672,host2:5672" (the format of RabbitMQ's own clients' address
// lists); blanks around commas are ignored, and "" is no list.
func ParseAMQPAddresses(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q: want HOST:PORT with a port in 1..65535", a)
		}
		out = append(out, a)
	}
	return out, nil
}

// FromOSEnv is FromEnv over the process environment.
func FromOSEnv() (*Config, error) { return FromEnv(os.LookupEnv) }
