package manifest

import (
	"errors"
	"reflect"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/tomlpos"
)

// Error is one problem with a manifest. It reads
// "FILE:LINE: ENTRY: KEY: MESSAGE", leaving out what is unknown: Line is
// 0 when unknown, Entry names the entry ("jobs[2] (gbt/realistic)",
// "hosts[0] (pi)", "defaults" or ""), and Key is within the entry, e.g.
// "gpus", "command[3]".
type Error = tomlpos.Error

// decodeError turns go-toml's errors into *Error, placed with the index:
// the key is found by its position in the document (go-toml's own key has
// no array indices, and an inline table has no header of its own). doc
// holds what was decoded (for naming the entry).
func decodeError(file string, ix *tomlpos.Index, doc *fileDoc, err error) error {
	var se *toml.StrictMissingError
	if errors.As(err, &se) {
		l := tomlpos.List{File: file}
		for i := range se.Errors {
			line, col := se.Errors[i].Position()
			table, name := placeKey(ix, line, col, se.Errors[i].Key())
			entry, key := entryKey(table, name, doc)
			l.Add(&Error{File: file, Line: line, Entry: entry, Key: key, Message: unknownMessage(table, name)})
		}
		return l.Err()
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col := de.Position()
		table, name := placeKey(ix, line, col, de.Key())
		entry, key := entryKey(table, name, doc)
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if strings.HasPrefix(msg, "cannot decode TOML ") {
			msg = "wrong type: " + strings.TrimPrefix(msg, "cannot decode TOML ")
			if want := wantOf(table, name); want != "" {
				msg = "must be " + want
			}
		}
		return &Error{File: file, Line: line, Entry: entry, Key: key, Message: msg}
	}
	return &Error{File: file, Message: err.Error()}
}

// placeKey finds the table holding the key go-toml complains of and the
// key's name in it: by the error's position, else by the table whose
// header is above that line.
func placeKey(ix *tomlpos.Index, line, col int, goKey []string) (table, name string) {
	if path := ix.At(ix.Offset(line, col)); path != "" {
		table, name = tomlpos.Parent(path), path[len(tomlpos.Parent(path)):]
		return table, strings.TrimPrefix(name, ".")
	}
	if len(goKey) > 0 {
		name = goKey[len(goKey)-1]
	}
	return ix.TableAt(line), name
}

// entryKey names the entry a key of table belongs to, and the key within
// it ("hyper.lr" for a key of a job's hyper table).
func entryKey(table, name string, doc *fileDoc) (entry, key string) {
	entry, within := entryOf(table, doc)
	if within != "" && name != "" {
		return entry, within + "." + name
	}
	if name == "" {
		return entry, within
	}
	return entry, name
}

// entryOf names the entry a table path belongs to ("jobs[2] (gbt/realistic)")
// and the sub-table within it ("hyper"), if any.
func entryOf(table string, doc *fileDoc) (entry, within string) {
	if table == "" {
		return "", ""
	}
	head, rest, _ := strings.Cut(table, ".")
	switch {
	case strings.HasPrefix(head, "jobs["):
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(head, "jobs["), "]"))
		if err == nil && i >= 0 && i < len(doc.Jobs) {
			return jobEntryName(i, &doc.Jobs[i]), rest
		}
	case strings.HasPrefix(head, "hosts["):
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(head, "hosts["), "]"))
		if err == nil && i >= 0 && i < len(doc.Hosts) && doc.Hosts[i].Name != "" {
			return head + " (" + arbiter.Clip(doc.Hosts[i].Name, 40) + ")", rest
		}
	}
	return head, rest
}

// schemaOf returns the struct type of the table at path.
func schemaOf(table string) reflect.Type {
	head, rest, _ := strings.Cut(table, ".")
	if rest != "" {
		return nil // inside hyper: anything goes
	}
	switch {
	case head == "":
		return reflect.TypeOf(fileDoc{})
	case head == "defaults":
		return reflect.TypeOf(defaults{})
	case strings.HasPrefix(head, "jobs"):
		return reflect.TypeOf(jobEntry{})
	case strings.HasPrefix(head, "hosts"):
		return reflect.TypeOf(hostEntry{})
	}
	return nil
}

func unknownMessage(table, key string) string {
	t := schemaOf(table)
	if t == nil {
		return "unknown key"
	}
	names := tomlpos.FieldNames(t)
	if strings.HasPrefix(table, "defaults") && (key == "model" || key == "name") {
		return "a job's " + key + " has no default; set it in each [[jobs]] entry"
	}
	if table == "" {
		return "unknown key; the top level takes " + strings.Join(names, ", ")
	}
	return "unknown key; the keys allowed here are " + strings.Join(names, ", ")
}

// wantOf says what the value of key in table must be, from its want tag or
// Go type; "" when key is not in the schema.
func wantOf(table, key string) string {
	t := schemaOf(table)
	if t == nil {
		return ""
	}
	f, ok := tomlpos.Field(t, key)
	if !ok {
		return ""
	}
	return tomlpos.Want(f)
}
