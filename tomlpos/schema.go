package tomlpos

import (
	"reflect"
	"strings"
)

// The words for what a key takes, from the Go type it decodes into, so that
// a decoding error says "must be a whole number" rather than go-toml's
// "cannot decode TOML string into struct field ... of type int".

// Want says what a value of field f must be: its want tag when it has one
// (e.g. `want:"a number of GiB"`), else Describe of its type.
func Want(f reflect.StructField) string {
	if w := f.Tag.Get("want"); w != "" {
		return w
	}
	return Describe(f.Type)
}

// Describe says what a value of type t must be, e.g. "a string", "an array
// of tables"; "" for a type it has no words for.
func Describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "a table"
	case reflect.Slice:
		switch t.Elem().Kind() {
		case reflect.String:
			return "an array of strings"
		case reflect.Struct, reflect.Map:
			return "an array of tables"
		}
		return "an array"
	}
	return ""
}

// Field returns the field of struct type t that the key name decodes into
// (by its toml tag), looking into embedded structs.
func Field(t reflect.Type, name string) (reflect.StructField, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			if sf, ok := Field(f.Type, name); ok {
				return sf, true
			}
			continue
		}
		if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// FieldNames returns the keys struct type t takes (its fields' toml tags,
// embedded structs' included), in field order.
func FieldNames(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var names []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			names = append(names, FieldNames(f.Type)...)
			continue
		}
		if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}
