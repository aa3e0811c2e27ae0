// Command ollama-harness renders Ollama Go templates (a model's TEMPLATE) as Ollama's chat route does, speaking
// chatgold's harness protocol (runners/protocol/PROTOCOL.md) on stdin/stdout. Standard library only.
//
// What it reproduces, read from github.com/ollama/ollama at tag v0.33.0-rc2 (fb307609; the index.json, the
// .gotmpl files and LICENSE there are byte-identical to v0.33.2's, commit b79067b0, which ggufdoctor pins):
//   - template/template.go:120-143 the template functions (json, currentDate, yesterdayDate, toTypeScriptType),
//     :145-165 Parse (missingkey=zero), :171-189 Vars (identifiers, lower-cased), :257-282 Execute's messages
//     path and the values it binds, :357-374 collate, :376-513 the template-side types of tools, tool calls
//     and messages (their String methods decide what `{{ .Tools }}` or `{{ .Function.Arguments }}` print).
//   - api/types.go:197-219 Message (role lower-cased on decode), :221-303 tool calls, :305-497 tools, tool
//     properties (insertion-ordered), PropertyType and ToTypeScriptType, :1126-1230 ThinkValue.
//   - server/prompt.go:135-156 renderPrompt, server/routes.go:2610-2632 the capability checks of the chat
//     route (tools and thinking the model lacks are refused), server/images.go:530-580 their error text.
//
// The request is decoded with encoding/json into this program's own mirror of api.ChatRequest's messages and
// tools, so a conversation Ollama's types cannot hold is refused with Go's own decoding error.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"text/template"
	"text/template/parse"
	"time"
)

// build identifies this program's source (set with -ldflags "-X main.build=<digest>").
var build = "dev"

const modelName = "chatgold"

const memoryLimit = 4 << 30

// ---- api types (api/types.go) ----

type message struct {
	Role       string      `json:"role"`
	Content    string      `json:"content"`
	Thinking   string      `json:"thinking,omitempty"`
	Images     []imageData `json:"images,omitempty"`
	ToolCalls  []toolCall  `json:"tool_calls,omitempty"`
	ToolName   string      `json:"tool_name,omitempty"`
	ToolCallID string      `json:"tool_call_id,omitempty"`
}

// UnmarshalJSON lower-cases the role, as api.Message does (api/types.go:209-219).
func (m *message) UnmarshalJSON(b []byte) error {
	type plain message
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*m = message(p)
	m.Role = strings.ToLower(m.Role)
	return nil
}

// imageData is api.ImageData: bytes, base64 in JSON.
type imageData []byte

type toolCall struct {
	ID       string           `json:"id,omitempty"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Index     int                    `json:"index"`
	Name      string                 `json:"name"`
	Arguments map[string]interface{} `json:"arguments"`
}

type tool struct {
	Type     string       `json:"type"`
	Items    interface{}  `json:"items,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string             `json:"name"`
	Description string             `json:"description,omitempty"`
	Parameters  toolFunctionParams `json:"parameters"`
}

type toolFunctionParams struct {
	Type       string       `json:"type"`
	Defs       interface{}  `json:"$defs,omitempty"`
	Items      interface{}  `json:"items,omitempty"`
	Required   []string     `json:"required,omitempty"`
	Properties *propertyMap `json:"properties"`
}

// propertyType is a JSON Schema type: one string or a list of them.
type propertyType []string

func (pt *propertyType) UnmarshalJSON(data []byte) error {
	var one string
	if err := json.Unmarshal(data, &one); err == nil {
		*pt = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return err
	}
	*pt = many
	return nil
}

func (pt propertyType) MarshalJSON() ([]byte, error) {
	if len(pt) == 1 {
		return json.Marshal(pt[0])
	}
	return json.Marshal([]string(pt))
}

func (pt propertyType) String() string {
	switch len(pt) {
	case 0:
		return ""
	case 1:
		return pt[0]
	}
	return fmt.Sprintf("%v", []string(pt))
}

type toolProperty struct {
	AnyOf       []toolProperty `json:"anyOf,omitempty"`
	Type        propertyType   `json:"type,omitempty"`
	Items       interface{}    `json:"items,omitempty"`
	Description string         `json:"description,omitempty"`
	Enum        []interface{}  `json:"enum,omitempty"`
	Properties  *propertyMap   `json:"properties,omitempty"`
	Required    []string       `json:"required,omitempty"`
}

func (tp toolProperty) typeScript() string {
	if len(tp.AnyOf) > 0 {
		parts := make([]string, 0, len(tp.AnyOf))
		for _, alt := range tp.AnyOf {
			parts = append(parts, alt.typeScript())
		}
		return strings.Join(parts, " | ")
	}
	if len(tp.Type) == 0 {
		return "any"
	}
	parts := make([]string, 0, len(tp.Type))
	for _, t := range tp.Type {
		parts = append(parts, typeScriptName(t))
	}
	return strings.Join(parts, " | ")
}

func typeScriptName(jsonType string) string {
	switch jsonType {
	case "string", "boolean", "null":
		return jsonType
	case "number", "integer":
		return "number"
	case "array":
		return "any[]"
	case "object":
		return "Record<string, any>"
	}
	return "any"
}

// propertyMap keeps its keys in the order they arrived (Ollama's ordered map): a key seen twice keeps its
// first place and its last value.
type propertyMap struct {
	keys   []string
	values map[string]toolProperty
}

func (p *propertyMap) UnmarshalJSON(data []byte) error {
	p.keys, p.values = nil, map[string]toolProperty{}
	dec := json.NewDecoder(bytes.NewReader(data))
	open, err := dec.Token()
	if err != nil {
		return err
	}
	if delim, ok := open.(json.Delim); !ok || delim != '{' {
		return &json.UnmarshalTypeError{Value: describeToken(open), Type: mapType}
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		var value toolProperty
		if err := dec.Decode(&value); err != nil {
			return err
		}
		name := key.(string)
		if _, seen := p.values[name]; !seen {
			p.keys = append(p.keys, name)
		}
		p.values[name] = value
	}
	_, err = dec.Token()
	return err
}

var mapType = reflect.TypeOf(map[string]toolProperty{})

func describeToken(t json.Token) string {
	switch t.(type) {
	case json.Delim:
		return "array"
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

func (p propertyMap) MarshalJSON() ([]byte, error) {
	if p.values == nil {
		return []byte("null"), nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, key := range p.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		v, err := json.Marshal(p.values[key])
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// toMap is the plain Go map the template sees (order lost, as ToMap loses it); nil when absent.
func (p *propertyMap) toMap() map[string]toolProperty {
	if p == nil || p.values == nil {
		return nil
	}
	out := make(map[string]toolProperty, len(p.values))
	for k, v := range p.values {
		out[k] = v
	}
	return out
}

// ---- template-side values (template/template.go:376-513) ----

func marshalText(v interface{}) string {
	b, _ := json.Marshal(v)
	return string(b)
}

type templateTools []templateTool

func (t templateTools) String() string { return marshalText(t) }

type templateArgs map[string]interface{}

func (t templateArgs) String() string {
	if t == nil {
		return "{}"
	}
	return marshalText(t)
}

type templateProperties map[string]toolProperty

func (t templateProperties) String() string {
	if t == nil {
		return "{}"
	}
	return marshalText(t)
}

type templateTool struct {
	Type     string               `json:"type"`
	Items    interface{}          `json:"items,omitempty"`
	Function templateToolFunction `json:"function"`
}

func (t templateTool) String() string { return marshalText(t) }

type templateToolFunction struct {
	Name        string                 `json:"name"`
	Description string                 `json:"description"`
	Parameters  templateToolParameters `json:"parameters"`
}

type templateToolParameters struct {
	Type       string             `json:"type"`
	Defs       interface{}        `json:"$defs,omitempty"`
	Items      interface{}        `json:"items,omitempty"`
	Required   []string           `json:"required,omitempty"`
	Properties templateProperties `json:"properties"`
}

type templateToolCall struct {
	ID       string
	Function templateToolCallFunction
}

type templateToolCallFunction struct {
	Index     int
	Name      string
	Arguments templateArgs
}

type templateMessage struct {
	Role       string
	Content    string
	Thinking   string
	Images     []imageData
	ToolCalls  []templateToolCall
	ToolName   string
	ToolCallID string
}

func templateToolsOf(tools []tool) templateTools {
	if tools == nil {
		return nil
	}
	out := make(templateTools, len(tools))
	for i, t := range tools {
		out[i] = templateTool{Type: t.Type, Items: t.Items, Function: templateToolFunction{
			Name: t.Function.Name, Description: t.Function.Description,
			Parameters: templateToolParameters{
				Type: t.Function.Parameters.Type, Defs: t.Function.Parameters.Defs,
				Items: t.Function.Parameters.Items, Required: t.Function.Parameters.Required,
				Properties: templateProperties(t.Function.Parameters.Properties.toMap()),
			}}}
	}
	return out
}

func templateMessagesOf(msgs []*message) []*templateMessage {
	if msgs == nil {
		return nil
	}
	out := make([]*templateMessage, len(msgs))
	for i, m := range msgs {
		var calls []templateToolCall
		for _, c := range m.ToolCalls {
			calls = append(calls, templateToolCall{ID: c.ID, Function: templateToolCallFunction{
				Index: c.Function.Index, Name: c.Function.Name, Arguments: templateArgs(c.Function.Arguments)}})
		}
		out[i] = &templateMessage{Role: m.Role, Content: m.Content, Thinking: m.Thinking, Images: m.Images,
			ToolCalls: calls, ToolName: m.ToolName, ToolCallID: m.ToolCallID}
	}
	return out
}

// collate joins the system messages' contents and merges consecutive messages of one role (tool messages
// excepted) with a blank line, as template/template.go:357-374 does.
func collate(msgs []message) (string, []*message) {
	var system []string
	var out []*message
	for i := range msgs {
		if msgs[i].Role == "system" {
			system = append(system, msgs[i].Content)
		}
		if n := len(out); n > 0 && out[n-1].Role == msgs[i].Role && msgs[i].Role != "tool" {
			out[n-1].Content += "\n\n" + msgs[i].Content
		} else {
			out = append(out, &msgs[i])
		}
	}
	return strings.Join(system, "\n\n"), out
}

// ---- parsing and variables ----

func funcs(now time.Time) template.FuncMap {
	return template.FuncMap{
		"json": func(v interface{}) string { return marshalText(v) },
		// The format argument is accepted and ignored, as in Ollama; the clock is the case's frozen one.
		"currentDate":   func(args ...string) string { return now.Format("2006-01-02") },
		"yesterdayDate": func(args ...string) string { return now.AddDate(0, 0, -1).Format("2006-01-02") },
		"toTypeScriptType": func(v interface{}) string {
			switch p := v.(type) {
			case toolProperty:
				return p.typeScript()
			case *toolProperty:
				if p != nil {
					return p.typeScript()
				}
			}
			return "any"
		},
	}
}

// identifiers lists the field and variable names a node uses (template/template.go:516-582).
func identifiers(n parse.Node) ([]string, error) {
	switch n := n.(type) {
	case *parse.ListNode:
		var names []string
		for _, c := range n.Nodes {
			found, err := identifiers(c)
			if err != nil {
				return names, err
			}
			names = append(names, found...)
		}
		return names, nil
	case *parse.TemplateNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined template specified")
		}
		return identifiers(n.Pipe)
	case *parse.ActionNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined action in template")
		}
		return identifiers(n.Pipe)
	case *parse.BranchNode:
		if n.Pipe == nil {
			return nil, errors.New("undefined branch")
		}
		names, err := identifiers(n.Pipe)
		if err != nil {
			return names, err
		}
		for _, list := range []*parse.ListNode{n.List, n.ElseList} {
			if list != nil {
				found, err := identifiers(list)
				if err != nil {
					return names, err
				}
				names = append(names, found...)
			}
		}
		return names, nil
	case *parse.IfNode:
		return identifiers(&n.BranchNode)
	case *parse.RangeNode:
		return identifiers(&n.BranchNode)
	case *parse.WithNode:
		return identifiers(&n.BranchNode)
	case *parse.PipeNode:
		var names []string
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				found, err := identifiers(a)
				if err != nil {
					return names, err
				}
				names = append(names, found...)
			}
		}
		return names, nil
	case *parse.FieldNode:
		return n.Ident, nil
	case *parse.VariableNode:
		return n.Ident, nil
	}
	return nil, nil
}

type compiled struct {
	tmpl *template.Template
	vars map[string]bool
	err  error // the parse error, if any
}

func compile(source string, now time.Time) compiled {
	t, err := template.New("").Option("missingkey=zero").Funcs(funcs(now)).Parse(source)
	if err != nil {
		return compiled{err: err}
	}
	vars := map[string]bool{}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		for _, n := range tt.Root.Nodes {
			names, err := identifiers(n)
			if err != nil {
				return compiled{err: err}
			}
			for _, name := range names {
				vars[strings.ToLower(name)] = true
			}
		}
	}
	return compiled{tmpl: t, vars: vars}
}

// ---- the protocol ----

type conversation struct {
	Messages             json.RawMessage            `json:"messages"`
	Tools                json.RawMessage            `json:"tools"`
	Documents            json.RawMessage            `json:"documents"`
	AddGenerationPrompt  bool                       `json:"add_generation_prompt"`
	ContinueFinalMessage bool                       `json:"continue_final_message"`
	Kwargs               map[string]json.RawMessage `json:"kwargs"`
	Now                  string                     `json:"now"`
}

type request struct {
	Cmd      string `json:"cmd"`
	Version  int    `json:"version"`
	Seq      int    `json:"seq"`
	Template string `json:"template"`
	conversation
	Cases []conversation `json:"cases"`
}

// chatRequest is the part of api.ChatRequest a render reads.
type chatRequest struct {
	Messages []message `json:"messages"`
	Tools    []tool    `json:"tools"`
}

type refusal struct {
	Message string `json:"message"`
	Kind    string `json:"kind"`
}

type skip struct {
	Reason string `json:"reason"`
}

type errored struct {
	Message string `json:"message"`
}

type response struct {
	Seq     int      `json:"seq"`
	Text    *string  `json:"text,omitempty"`
	Raised  *refusal `json:"raised,omitempty"`
	Skipped *skip    `json:"skipped,omitempty"`
	Errored *errored `json:"errored,omitempty"`
}

// templatePackage: render as template.Execute does when called directly (no chat-route checks), the way
// ggufdoctor recorded its goldens; the default is the chat route.
var templatePackage = false

// decodeOnly: answer "" once the request is one Ollama's chat API accepts (its types decode it), without
// rendering: the check a request passes before Ollama hands the GGUF's own Jinja to llama-server.
var decodeOnly = false

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func render(c compiled, conv conversation) response {
	if !isNull(conv.Documents) {
		return response{Skipped: &skip{"Ollama's chat API has no documents"}}
	}
	if conv.ContinueFinalMessage {
		return response{Skipped: &skip{"Ollama's chat API has no continue_final_message"}}
	}
	if !conv.AddGenerationPrompt && !templatePackage {
		return response{Skipped: &skip{"Ollama's chat API has no add_generation_prompt: it always renders for generation"}}
	}
	var think *bool
	for key, raw := range conv.Kwargs {
		var b bool
		if key == "enable_thinking" && json.Unmarshal(raw, &b) == nil {
			think = &b
			continue
		}
		return response{Skipped: &skip{fmt.Sprintf("Ollama's chat API cannot pass the template variable %s", key)}}
	}
	body := []byte(`{"messages":` + string(orNull(conv.Messages)) + `,"tools":` + string(orNull(conv.Tools)) + `}`)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		// Ollama answers 400 before any template runs: the request as a whole is declined.
		return response{Raised: &refusal{err.Error(), "unsupported"}}
	}
	if decodeOnly {
		empty := ""
		return response{Text: &empty}
	}
	if c.err != nil {
		return response{Raised: &refusal{c.err.Error(), "compile"}}
	}
	if !c.vars["messages"] {
		return response{Skipped: &skip{"a template without .Messages takes Ollama's legacy prompt/response path, which this harness does not reproduce"}}
	}
	if !templatePackage {
		// The chat route's capability checks (server/routes.go:2610-2632): tools need a template that uses
		// .Tools; thinking needs a template with thinking tags, which none of this harness's callers have,
		// so think=true is refused and think=false passes through.
		if len(req.Tools) > 0 && !c.vars["tools"] {
			return response{Raised: &refusal{modelName + " does not support tools", "unsupported"}}
		}
		if think != nil && *think {
			return response{Raised: &refusal{fmt.Sprintf("%q does not support thinking", modelName), "unsupported"}}
		}
	}
	thinkLevel := ""
	if think != nil && *think {
		thinkLevel = "medium"
	}
	system, msgs := collate(req.Messages)
	values := map[string]interface{}{
		"System":     system,
		"Messages":   templateMessagesOf(msgs),
		"Tools":      templateToolsOf(req.Tools),
		"Response":   "",
		"Think":      think != nil && *think,
		"ThinkLevel": thinkLevel,
		"IsThinkSet": think != nil,
	}
	var out bytes.Buffer
	if err := c.tmpl.Execute(&out, values); err != nil {
		return response{Raised: &refusal{err.Error(), "render"}}
	}
	text := out.String()
	return response{Text: &text}
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func clock(now string) time.Time {
	t, err := time.Parse(time.RFC3339, now)
	if err != nil {
		return time.Date(2025, 6, 15, 9, 30, 0, 0, time.UTC)
	}
	return t.UTC()
}

// printVars writes the sorted variables Template.Vars gives for the Go template on stdin (a JSON list), so
// that the Python side's reading of them can be checked against the parse tree.
func printVars() {
	source, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c := compile(string(source), time.Now())
	if c.err != nil {
		fmt.Fprintln(os.Stderr, c.err)
		os.Exit(1)
	}
	names := make([]string, 0, len(c.vars))
	for name := range c.vars {
		names = append(names, name)
	}
	sort.Strings(names)
	b, _ := json.Marshal(names)
	fmt.Println(string(b))
}

func main() {
	for _, arg := range os.Args[1:] {
		switch arg {
		case "--template-package":
			templatePackage = true
		case "--decode-only":
			decodeOnly = true
		case "--vars":
			printVars()
			return
		default:
			fmt.Fprintf(os.Stderr, "usage: ollama-harness [--template-package | --decode-only | --vars < TEMPLATE]\n")
			os.Exit(2)
		}
	}
	// Address-space cap, as the project's Python harnesses have: a template that builds a gigantic string
	// fails to allocate instead of taking the machine.
	limit := syscall.Rlimit{Cur: memoryLimit, Max: memoryLimit}
	var current syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_AS, &current) == nil && current.Max < limit.Max {
		limit = syscall.Rlimit{Cur: current.Max, Max: current.Max}
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &limit); err != nil {
		fmt.Fprintln(os.Stderr, "cannot cap the address space:", err)
	}
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	send := func(v interface{}) {
		if err := enc.Encode(v); err != nil {
			fmt.Fprintln(os.Stderr, "cannot encode a response:", err)
			os.Exit(1)
		}
		out.Flush()
	}
	for {
		line, err := in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) == 0 {
			if err != nil {
				return
			}
			continue
		}
		var req request
		if jerr := json.Unmarshal(line, &req); jerr != nil {
			fmt.Fprintln(os.Stderr, "request is not JSON:", jerr)
			os.Exit(1)
		}
		switch req.Cmd {
		case "start":
			if req.Version != 2 && req.Version != 1 {
				send(map[string]string{"error": fmt.Sprintf("unsupported protocol version %d", req.Version)})
				return
			}
			mode := "chat-route"
			if templatePackage {
				mode = "template-package"
			} else if decodeOnly {
				mode = "decode-only"
			}
			send(map[string]interface{}{"name": "ollama", "version": "0.33.2", "language": "go",
				"homepage": "https://github.com/ollama/ollama", "protocol": 2, "build": build + "+" + mode})
		case "render":
			r := render(compile(req.Template, clock(req.Now)), req.conversation)
			r.Seq = req.Seq
			send(r)
		case "batch":
			var c *compiled
			for i, conv := range req.Cases {
				if c == nil {
					compiledOnce := compile(req.Template, clock(conv.Now))
					c = &compiledOnce
				}
				current := *c
				if i > 0 && conv.Now != req.Cases[0].Now { // the clock is bound at parse time
					current = compile(req.Template, clock(conv.Now))
				}
				r := render(current, conv)
				r.Seq = req.Seq + i
				send(r)
			}
		case "stop":
			return
		default:
			fmt.Fprintln(os.Stderr, "unknown command:", req.Cmd)
			os.Exit(1)
		}
		if err == io.EOF {
			return
		}
	}
}
