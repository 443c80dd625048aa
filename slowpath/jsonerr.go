package slowpath

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/valyala/fastjson"
)

// describeJSON says what is wrong with a request body that is not one JSON
// object, and where: "" when it is one. Error path only (it runs after the
// fast parser refused the body), so it may allocate.
//
//	truncated         the body ends inside a value (the byte count and where the last line ends)
//	trailing data     bytes after the object's closing brace, with their line:column
//	not an object     a valid JSON array, string, number, ... instead of an object
//	invalid           encoding/json's reason, with line:column and byte offset
func describeJSON(body []byte) string {
	if off := tooDeep(body, fastjson.MaxDepth); off >= 0 {
		line, col := lineCol(body, off)
		return fmt.Sprintf("the body nests deeper than %d levels at line %d, column %d (byte offset %d).", fastjson.MaxDepth, line, col, off)
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	var se *json.SyntaxError
	switch {
	case err == nil:
		v := bytes.TrimLeft(raw, " \t\r\n")
		if len(v) > 0 && v[0] == '{' {
			return ""
		}
		return "the body is a JSON " + jsonKind(v) + ", not an object."
	case !errors.As(err, &se):
		return ""
	case strings.Contains(se.Error(), "unexpected end of JSON input"):
		line, col := lineCol(body, len(body))
		return fmt.Sprintf("the body is truncated: it ends at byte %d (line %d, column %d) inside an unfinished value.", len(body), line, col)
	case strings.Contains(se.Error(), "after top-level value"):
		off := int(se.Offset) - 1
		line, col := lineCol(body, off)
		return fmt.Sprintf("trailing data after the JSON object at line %d, column %d (byte offset %d).", line, col, off)
	default:
		off := max(int(se.Offset)-1, 0)
		line, col := lineCol(body, off)
		return fmt.Sprintf("%s at line %d, column %d (byte offset %d).", strings.TrimPrefix(se.Error(), "json: "), line, col, off)
	}
}

func jsonKind(v []byte) string {
	switch {
	case len(v) == 0:
		return "nothing"
	case v[0] == '[':
		return "array"
	case v[0] == '"':
		return "string"
	case v[0] == 't' || v[0] == 'f':
		return "boolean"
	case v[0] == 'n':
		return "null"
	}
	return "number"
}

// tooDeep returns the offset of the bracket that opens level limit+1, or -1.
func tooDeep(b []byte, limit int) int {
	return walkBrackets(b, func(depth int) bool { return depth > limit })
}

// walkBrackets walks b's brackets outside strings and returns the offset
// of the first after which at(depth) holds (depth counted after it), or -1.
func walkBrackets(b []byte, at func(depth int) bool) int {
	depth, inStr := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[' || c == '}' || c == ']':
			if c == '{' || c == '[' {
				depth++
			} else {
				depth--
			}
			if at(depth) {
				return i
			}
		}
	}
	return -1
}

// lineCol returns the 1-based line and column (in bytes) of offset off.
func lineCol(b []byte, off int) (line, col int) {
	off = min(max(off, 0), len(b))
	line = 1 + bytes.Count(b[:off], []byte{'\n'})
	return line, off - (bytes.LastIndexByte(b[:off], '\n') + 1) + 1
}
