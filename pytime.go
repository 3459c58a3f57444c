package arbiter

import "time"

// PyISOFormat writes t as Python's isoformat() writes a UTC datetime, the
// form the swap arbiter of seed 000 used on its wire (its compatible
// endpoints, the spark webhook, a schedule's next_run):
// "2026-06-18T07:00:00.123456+00:00", the fraction (six digits, truncated
// to microseconds as Python keeps them) left out when it is zero. Its
// clients read times with datetime.fromisoformat, which before Python 3.11
// refuses Go's "Z" and nanoseconds; the form is RFC 3339 all the same.
func PyISOFormat(t time.Time) string {
	u := t.UTC()
	if u.Nanosecond()/1000 == 0 {
		return u.Format("2006-01-02T15:04:05+00:00")
	}
	return u.Format("2006-01-02T15:04:05.000000+00:00")
}
