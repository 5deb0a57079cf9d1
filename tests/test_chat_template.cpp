// Chat templates: byte-identical output against goldens rendered by Python transformers
// (tools/chat-goldens/render.py), parse errors with positions, and interpreter features whose
// expected values follow from Python/Jinja2 semantics.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support.h"
#include "tokenizer/chat_template.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;

fs::path chat_dir() { return test::source_dir() / "tests" / "data" / "chat"; }

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f) << "cannot open " << p;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Renders a template with plain variables (no chat wrapper).
std::string render(const std::string& src, const Json& vars = Json::object()) {
  jinja::Context ctx;
  for (auto& [k, v] : vars.items()) ctx.emplace_back(k, json_to_value(v));
  return jinja::Template::parse(src).render(ctx);
}

std::string parse_error(const std::string& src) {
  try {
    jinja::Template::parse(src);
  } catch (const jinja::TemplateError& e) {
    return e.what();
  }
  return "(parsed)";
}

TEST(ChatTemplate, GoldensFromTransformers) {
  Json convs = Json::parse(slurp(chat_dir() / "conversations.json"));
  Json specials = Json::parse(slurp(chat_dir() / "special_tokens.json"));
  ASSERT_GE(convs.size(), 10u);
  int templates = 0, compared = 0;
  for (auto& entry : fs::directory_iterator(chat_dir() / "templates")) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    std::string name = entry.path().stem().string();
    ASSERT_TRUE(specials.contains(name)) << name;
    auto special = [&](const char* key) {
      auto& v = specials[name][key];
      return v.is_null() ? std::string() : v.get<std::string>();
    };
    ChatTemplate tmpl(slurp(entry.path()));
    for (auto& conv : convs) {
      std::string conv_name = conv["name"];
      SCOPED_TRACE(name + "__" + conv_name);
      std::string golden = slurp(chat_dir() / "golden" / (name + "__" + conv_name + ".txt"));
      ++compared;
      auto run = [&] {
        return tmpl.render(conv["messages"], conv.value("tools", Json()), conv["add_generation_prompt"],
                           special("bos_token"), special("eos_token"), conv.value("extra", Json::object()));
      };
      if (golden.starts_with("ERROR: ")) {
        try {
          run();
          ADD_FAILURE() << "expected raise_exception: " << golden;
        } catch (const jinja::TemplateRaised& e) {
          EXPECT_EQ("ERROR: " + e.message(), golden);
        }
      } else if (golden.starts_with("EXCEPTION: ")) {
        EXPECT_THROW(run(), jinja::TemplateError) << golden;
      } else {
        EXPECT_EQ(run(), golden);
      }
    }
  }
  EXPECT_GE(templates, 6);
  EXPECT_EQ(compared, templates * static_cast<int>(convs.size()));
}

TEST(ChatTemplate, ParseErrorsNameLineAndColumn) {
  EXPECT_NE(parse_error("a\n{% if x %}b").find("line 2"), std::string::npos) << parse_error("a\n{% if x %}b");
  EXPECT_NE(parse_error("a\n{% if x %}b").find("expected 'endif'"), std::string::npos);
  EXPECT_NE(parse_error("{{ 1 + }}").find("line 1, column 8: expected an expression"), std::string::npos)
      << parse_error("{{ 1 + }}");
  EXPECT_NE(parse_error("x\n  {% frobnicate %}").find("line 2, column 6: unknown or unsupported tag 'frobnicate'"),
            std::string::npos)
      << parse_error("x\n  {% frobnicate %}");
  EXPECT_NE(parse_error("{{ 'abc }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(parse_error("{{ x ").find("unclosed tag"), std::string::npos);
  EXPECT_NE(parse_error("{# never closed").find("unclosed comment"), std::string::npos);
  EXPECT_NE(parse_error("{% break %}").find("outside of a for loop"), std::string::npos);
  EXPECT_NE(parse_error("{{ a ? b }}").find("unexpected character '?'"), std::string::npos);
  EXPECT_NE(parse_error("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}").find("nesting deeper"), std::string::npos);
  std::string nested_ifs;
  for (int i = 0; i < 10000; ++i) nested_ifs += "{% if x %}";
  EXPECT_NE(parse_error(nested_ifs).find("nesting deeper"), std::string::npos);
}

TEST(ChatTemplate, RuntimeErrorsNameTheLine) {
  try {
    render("ok\n{{ missing.attr }}");
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'missing' is undefined"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ 'a' + 1 }}"), jinja::TemplateError);
  EXPECT_THROW(render("{{ 1 // 0 }}"), jinja::TemplateError);
  EXPECT_THROW(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"), jinja::TemplateError);
  EXPECT_THROW(render("{{ range(100000000) | length }}"), jinja::TemplateError);
  try {
    render("{{ raise_exception('bad ' ~ 42) }}");
    FAIL() << "expected raise_exception";
  } catch (const jinja::TemplateRaised& e) {
    EXPECT_EQ(e.message(), "bad 42");
  }
}

TEST(ChatTemplate, WhitespaceControl) {
  // trim_blocks eats the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("{{ 'v' }}\n{# comment #}\nz"), "v\nz");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(render("line\n"), "line");  // one trailing newline is dropped, like Jinja2
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  EXPECT_EQ(render("t {% if true %}x{% endif %}"), "t x");  // not at line start: kept
}

TEST(ChatTemplate, ValuesPrintLikePython) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.5, {'k': \"it's\"}] }}"), "[1, 'a', None, True, 2.5, {'k': \"it's\"}]");
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // -2 }} {{ -7 % 3 }}"),
            "1.0 1e+16 1.5e-07 0.30000000000000004 2.5 -4 2");
  EXPECT_EQ(render("{{ x | tojson }}", {{"x", {{"b", 1}, {"a", {"é", nullptr, 2.0, "q\"\n"}}}}}),
            "{\"b\": 1, \"a\": [\"é\", null, 2.0, \"q\\\"\\n\"]}");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", {{"x", {{"a", Json::array()}, {"b", {1}}}}}),
            "{\n  \"a\": [],\n  \"b\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ {'a': 1}.items() | list }}"), "[('a', 1)]");
  EXPECT_EQ(render("{{ '\\u00e9\\x41\\n' ~ \"'\" }}"), "éA\n'");
}

TEST(ChatTemplate, ExpressionsAndFilters) {
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ [1, 2, 3][-1] }} {{ 'héllo'[1] }}"), "bcd fedcba 3 é");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}{{ 'c' if not x }}", {{"x", false}}), "bc");
  EXPECT_EQ(render("{{ ' A b '.strip().lower().split(' ') }} {{ 'x,y'.split(',')[1] }}"), "['a', 'b'] y");
  EXPECT_EQ(render("{{ m.content.startswith(('x', 'he')) }} {{ m.get('nope', 5) }} {{ m.role is undefined }}",
                   {{"m", {{"content", "hello"}}}}),
            "True 5 True");
  EXPECT_EQ(render("{{ xs | selectattr('on') | map(attribute='n') | join('+') }}",
                   {{"xs", {{{"n", "a"}, {"on", true}}, {{"n", "b"}, {"on", false}}, {{"n", "c"}, {"on", 1}}}}}),
            "a+c");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | first }} {{ ['A', 'a', 'b'] | unique | list }} {{ 'héllo' | length }}"),
            "1 ['A', 'b'] 5");
  EXPECT_EQ(render("{{ undefined_var | default('d') }} {{ none | default('d') }} {{ '' | d('e', true) }}"), "d None e");
  EXPECT_EQ(render("{{ 'Hello World' | replace('o', '0') | upper }} {{ ' x ' | trim }} {{ 'ab' ~ 3 }}"), "HELL0 W0RLD x ab3");
  EXPECT_EQ(render("{{ range(5, 0, -2) | list }} {{ range(3, 3) | list }} {{ range(0, 7, 3) | list }}"), "[5, 3, 1] [] [0, 3, 6]");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 2 in [1, 2] }} {{ 'z' not in 'abc' }} {{ 3 is odd }} {{ x is mapping }}",
                   {{"x", Json::object()}}),
            "True True True True True");
}

TEST(ChatTemplate, LoopsScopesMacros) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ '|' if not loop.last }}{% endfor %}"), "1a|2b|3c");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.length }}{{ x }}{% endfor %}"), "2224");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "b=1;a=2;");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // Assignments inside a loop stay there; namespace attributes carry out.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set n = n + x %}{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(render("{% macro tag(name, open=true) %}<{{ '' if open else '/' }}{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('a', open=false) }}"),
            "<a></a>");
  EXPECT_EQ(render("{% set block | upper %}hi {{ 1 + 1 }}{% endset %}[{{ block }}]"), "[HI 2]");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }} {% endfor %}"),
            "-2 13 2- ");
}

TEST(ChatTemplate, MessagesAndChatmlFallback) {
  std::vector<ChatMessage> msgs{{"system", "Be brief."}, {"user", "Hi"}};
  msgs.push_back({"assistant", "", Json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}})});
  Json j = messages_to_json(msgs);
  EXPECT_FALSE(j[0].contains("tool_calls"));
  EXPECT_FALSE(j[0].contains("name"));
  EXPECT_EQ(j[2]["tool_calls"][0]["function"]["name"], "f");
  msgs.pop_back();
  EXPECT_EQ(render_chatml(msgs, true), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // The ChatML template file and the built-in fallback agree.
  EXPECT_EQ(render_chat(slurp(chat_dir() / "templates" / "chatml.jinja"), msgs, Json(), true, "", "<|im_end|>"),
            render_chatml(msgs, true));
}

std::string render_error(const std::string& src, uint64_t max_steps = jinja::kMaxRenderSteps) {
  try {
    jinja::Template::parse(src).render({}, max_steps);
  } catch (const jinja::TemplateError& e) {
    return e.what();
  }
  return "(rendered)";
}

// A template is untrusted input inside the model file: whatever it does, rendering ends with
// output or with one TemplateError naming the limit, in bounded time and memory.
TEST(ChatTemplateLimits, NestedLoopsRunOutOfSteps) {
  const std::string e = render_error(
      "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}");
  EXPECT_NE(e.find("rendering needs more than " + std::to_string(jinja::kMaxRenderSteps) + " steps"),
            std::string::npos)
      << e;
  // Work hidden inside one statement counts too: comparing, serializing and scanning big values.
  for (const char* src : {"{% set x = range(100000)|list %}{% for i in range(1000) %}{% if x == x %}{% endif %}{% endfor %}",
                          "{% set x = range(100000)|list %}{% for i in range(1000) %}{{ x|tojson|length }}{% endfor %}",
                          "{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{% if 'b' in s %}{% endif %}{% endfor %}",
                          "{% set x = range(2000)|list %}{% for i in range(1000) %}{{ x|unique|length }}{% endfor %}"}) {
    const std::string err = render_error(src);
    EXPECT_NE(err.find("steps, the limit for one render"), std::string::npos) << src << ": " << err;
  }
}

TEST(ChatTemplateLimits, OutputAndBuiltStringsAreBounded) {
  std::string e = render_error("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}");
  EXPECT_NE(e.find("the output would be"), std::string::npos) << e;
  EXPECT_NE(e.find("limit of " + std::to_string(jinja::kMaxRenderBytes) + " bytes"), std::string::npos) << e;
  e = render_error("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  EXPECT_NE(e.find("the ~ result would be"), std::string::npos) << e;
  e = render_error("{{ ('x' * 4000).replace('x', 'y' * 10000) }}");
  EXPECT_NE(e.find("replace() result would be"), std::string::npos) << e;
  e = render_error("{{ 'x'|indent(100000000000) }}");
  EXPECT_NE(e.find("the indent would be"), std::string::npos) << e;
  e = render_error("{{ 'ab' * 10000000 }}");
  EXPECT_NE(e.find("the repetition result would be 20000000 bytes"), std::string::npos) << e;
  e = render_error("{{ [1, 2] * 1000000 }}");
  EXPECT_NE(e.find("the repetition result would have 2000000 elements, more than the limit of " +
                   std::to_string(jinja::kMaxSequence)),
            std::string::npos)
      << e;
  e = render_error("{{ range(2000000)|list }}");
  EXPECT_NE(e.find("the range() result would have 2000000 elements"), std::string::npos) << e;
  e = render_error("{{ ('a,' * 2000000).split(',')|length }}");
  EXPECT_NE(e.find("the split() result would have 1000001 elements"), std::string::npos) << e;
  EXPECT_NE(parse_error(std::string(jinja::kMaxTemplateBytes + 1, 'x'))
                .find("bytes, more than the limit of " + std::to_string(jinja::kMaxTemplateBytes)),
            std::string::npos);
}

// Only stored values can be wrapped again and again, so storing checks their depth; a namespace
// that contains itself is the same case.
TEST(ChatTemplateLimits, ValuesNestOnlySoDeep) {
  for (const char* src : {"{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
                          "{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}",
                          "{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}"}) {
    const std::string e = render_error(src);
    EXPECT_NE(e.find("nested deeper than " + std::to_string(jinja::kMaxValueNesting) + " levels (or containing itself)"),
              std::string::npos)
        << src << ": " << e;
  }
  EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(3) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
            "[[[[]]]]");
}

// Python ints are unbounded, ours 64-bit: a result that does not fit is an error, not a wrapped
// number (or undefined behaviour), and a huge exponent does not loop.
TEST(ChatTemplateLimits, IntegerArithmeticNeverOverflows) {
  for (const char* src : {"{{ 2 ** 64 }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                          "{{ 4611686018427387904 * 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
                          "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1)|abs }}",
                          "{{ 3 ** 1000000000000000000 }}"}) {
    const std::string e = render_error(src);
    EXPECT_NE(e.find("integer result does not fit in 64 bits"), std::string::npos) << src << ": " << e;
  }
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 3 }} {{ 1 ** 1000000000000000000 }} {{ -7 // 2 }} {{ -7 % 3 }}"),
            "4611686018427387904 -8 1 -4 2");
  EXPECT_EQ(render("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}"),
            "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]");
  EXPECT_EQ(render("{{ '' * 1000000000000000000 }}{{ 1e300|int }}{{ [1, 2, 3][::9223372036854775807] }}"), "0[1]");
}

// The limits leave real templates room: a long conversation with tools through Qwen3's template
// uses under 1% of the step budget.
TEST(ChatTemplateLimits, RealTemplatesStayFarBelowTheBudget) {
  Json messages = Json::array();
  for (int i = 0; i < 500; ++i) {
    messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + ": what is the weather?"}});
    messages.push_back({{"role", "assistant"}, {"content", "<think>\nLet me see.\n</think>\n\nSunny, " + std::to_string(i)}});
  }
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const jinja::Context ctx = {{"messages", json_to_value(messages)},
                              {"tools", json_to_value(tools)},
                              {"add_generation_prompt", true}};
  const std::string out =
      jinja::Template::parse(slurp(chat_dir() / "templates" / "qwen3.jinja")).render(ctx, jinja::kMaxRenderSteps / 100);
  EXPECT_NE(out.find("Sunny, 499"), std::string::npos);
}

}  // namespace
}  // namespace minfer
