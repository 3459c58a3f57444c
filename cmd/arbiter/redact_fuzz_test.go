package main

import (
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzRedact: for any database target the PostgreSQL driver accepts (a
// URL or a key=value connection string) that carries a password, the
// logged form (redact) holds the password in no form: neither as it is
// nor escaped as in a URL. The target is fuzzed as a prefix, a password
// and a suffix, so that the fuzzer keeps finding strings that parse.
func FuzzRedact(f *testing.F) {
	// The driver's defaults must not bring a password the input does not hold.
	os.Unsetenv("PGPASSWORD")
	os.Setenv("PGPASSFILE", os.DevNull)
	os.Setenv("PGSERVICEFILE", os.DevNull)
	f.Add("postgres://arb:", "s3cret", "@db:5432/arb")
	f.Add("postgres://arb@db/arb?sslmode=disable&password=", "s3cret", "")
	f.Add("postgresql://db/arb?sslpassword=", "s3cret", "&password=s3cret2")
	f.Add("host=db user=arb password=", "s3cret", " dbname=arb")
	f.Add("host=db password = '", "a b\\' s3cret", "' sslpassword=s3cret x=1")
	f.Add("postgres://arb:", "p%40ss%2Fw0rd", "@db/arb")
	f.Add("postgres://db/arb?pass%77ord=", "s3cret", "")
	f.Add("dbname=arb\tpassword=", "s3cret", "")
	f.Fuzz(func(t *testing.T, prefix, pw, suffix string) {
		in := prefix + pw + suffix
		cfg, err := pgconn.ParseConfig(in)
		if err != nil || len(cfg.Password) < 6 {
			return // not a target the server would open, or a password too short to tell from the rest
		}
		out := redact(in)
		forms := []string{cfg.Password, url.QueryEscape(cfg.Password), url.PathEscape(cfg.Password), url.UserPassword("", cfg.Password).String()[1:]}
		for _, form := range forms {
			if len(form) < 6 || strings.Count(in, form) > 1 {
				continue // it is in the target elsewhere too (a user named like the password)
			}
			if strings.Contains(out, form) {
				t.Fatalf("redact(%q) = %q: the password %q is there (as %q)", in, out, cfg.Password, form)
			}
		}
	})
}
