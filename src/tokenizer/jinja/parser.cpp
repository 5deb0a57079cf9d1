// Lexer and recursive-descent parser. Whitespace handling follows Jinja2 with trim_blocks and
// lstrip_blocks on: "-" strips all whitespace on that side of a tag, "+" keeps it, a block or
// comment tag eats one newline after it and the spaces before it when alone on its line, and the
// source's line endings are normalised to "\n" with one trailing newline dropped.
#include <algorithm>
#include <charconv>
#include <set>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/pystr.h"

namespace minfer::jinja {
namespace detail {
namespace {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // text, name, operator, decoded string literal
  size_t offset = 0;
  int64_t int_value = 0;
  double float_value = 0;
};

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_ += '\n';
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_ += raw[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag == std::string::npos ? std::string::npos : tag - pos);
      if (tag == std::string::npos) {
        push_text(std::move(text), pos);
        break;
      }
      char kind = src_[tag + 1];
      char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      bool strip_before = mod == '-';
      bool keep_before = mod == '+' && kind != '{';
      if (strip_before) {
        text = pystr::strip(text, std::nullopt, false, true);
      } else if (kind != '{' && !keep_before) {  // lstrip_blocks
        size_t line_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        bool at_line_start = line_pos > 0 || pos == 0 || src_[pos - 1] == '\n';
        if (at_line_start && text.find_first_not_of(" \t", line_pos) == std::string::npos)
          text.resize(line_pos);
      }
      push_text(std::move(text), pos);
      size_t p = tag + 2 + (strip_before || keep_before ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", p);
        if (end == std::string::npos) fail_at(tag, "unclosed comment '{#'");
        bool strip_after = end > p && src_[end - 1] == '-';
        pos = after_tag(end + 2, strip_after, true);
        continue;
      }
      bool is_block = kind == '%';
      tokens_.push_back({is_block ? Tok::BlockBegin : Tok::VarBegin, "", tag});
      pos = lex_tag(p, is_block, tag);
    }
    tokens_.push_back({Tok::Eof, "", src_.size()});
    return std::move(tokens_);
  }

  std::pair<int, int> line_col(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void fail_at(size_t offset, const std::string& message) const {
    auto [line, col] = line_col(offset);
    throw TemplateError(str_cat("chat template syntax error at line ", line, ", column ", col, ": ", message));
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t at = src_.find('{', from); at != std::string::npos; at = src_.find('{', at + 1)) {
      if (at + 1 < src_.size() && (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#'))
        return at;
    }
    return std::string::npos;
  }

  void push_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), offset});
  }

  size_t after_tag(size_t pos, bool strip_after, bool trims_newline) {
    if (strip_after) {
      while (pos < src_.size() && pystr::is_space(static_cast<unsigned char>(src_[pos]))) ++pos;
    } else if (trims_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  // Tokens up to the closing "}}" / "%}" (only outside brackets, as Jinja2 does).
  size_t lex_tag(size_t pos, bool is_block, size_t tag_start) {
    const char close = is_block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
      if (pos >= src_.size()) fail_at(tag_start, is_block ? "unclosed tag '{%'" : "unclosed tag '{{'");
      auto at = [&](size_t i) { return i < src_.size() ? src_[i] : '\0'; };
      if (depth == 0) {
        bool minus = at(pos) == '-' && at(pos + 1) == close && at(pos + 2) == '}';
        bool plus = is_block && at(pos) == '+' && at(pos + 1) == close && at(pos + 2) == '}';
        if (minus || plus || (at(pos) == close && at(pos + 1) == '}')) {
          tokens_.push_back({is_block ? Tok::BlockEnd : Tok::VarEnd, "", pos});
          size_t end = pos + (minus || plus ? 3 : 2);
          return after_tag(end, minus, is_block && !plus);
        }
      }
      char c = src_[pos];
      size_t start = pos;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) ++pos;
        tokens_.push_back({Tok::Name, src_.substr(start, pos - start), start});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : two)
          if (src_.compare(pos, 2, t) == 0) op = t;
        if (op.size() == 1 && std::string("+-*/%~()[]{},.:|=<>").find(c) == std::string::npos)
          fail_at(pos, str_cat("unexpected character '", c, "'"));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        pos += op.size();
        tokens_.push_back({Tok::Op, op, start});
      }
    }
  }

  size_t lex_number(size_t pos) {
    size_t start = pos;
    auto digits = [&] {
      while (pos < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos])) ||
                                   (src_[pos] == '_' && pos + 1 < src_.size() &&
                                    std::isdigit(static_cast<unsigned char>(src_[pos + 1])))))
        ++pos;
    };
    digits();
    bool is_float = false;
    if (pos + 1 < src_.size() && src_[pos] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos + 1]))) {
      is_float = true;
      ++pos;
      digits();
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t q = pos + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        pos = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos; ++i)
      if (src_[i] != '_') text += src_[i];
    Token t{is_float ? Tok::Float : Tok::Int, text, start};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else if (std::from_chars(text.data(), text.data() + text.size(), t.int_value).ec != std::errc()) {
      fail_at(start, "integer literal out of range: " + text);
    }
    tokens_.push_back(t);
    return pos;
  }

  // Python string literal escapes (\n \t \\ \' \" \xhh \uXXXX \UXXXXXXXX, octal); unknown escapes
  // keep their backslash.
  size_t lex_string(size_t pos) {
    char quote = src_[pos];
    size_t start = pos++;
    std::string out;
    while (true) {
      if (pos >= src_.size()) fail_at(start, "unterminated string literal");
      char c = src_[pos];
      if (c == quote) break;
      if (c != '\\' || pos + 1 >= src_.size()) {
        out += c;
        ++pos;
        continue;
      }
      char e = src_[pos + 1];
      pos += 2;
      auto hex = [&](int n) {
        if (pos + n > src_.size()) fail_at(pos, "truncated \\x/\\u escape");
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          char h = src_[pos + i];
          int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                  : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (d < 0) fail_at(pos, "invalid hex digit in escape");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        pos += n;
        out += pystr::encode(std::u32string(1, static_cast<char32_t>(v)));
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++i)
              v = v * 8 + static_cast<uint32_t>(src_[pos++] - '0');
            out += pystr::encode(std::u32string(1, static_cast<char32_t>(v)));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({Tok::String, out, start});
    return pos + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_{0};
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(const Lexer& lexer, std::vector<Token> tokens) : lexer_(lexer), toks_(std::move(tokens)) {}

  Body parse_template() {
    std::string stop;
    Body body = parse_body({}, stop);
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  int line() const { return lexer_.line_col(cur().offset).first; }
  [[noreturn]] void fail(const std::string& message) const { lexer_.fail_at(cur().offset, message); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "'%}'";
      case Tok::VarEnd: return "'}}'";
      case Tok::Text: return "text";
      case Tok::String: return "string literal";
      case Tok::Int:
      case Tok::Float: return "number " + t.text;
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(str_cat("expected '", op, "', found ", describe(cur())));
  }
  std::string expect_name(const char* what) {
    if (cur().type != Tok::Name) fail(str_cat("expected ", what, ", found ", describe(cur())));
    return toks_[pos_++].text;
  }
  void expect_block_end(const char* tag) {
    if (cur().type != Tok::BlockEnd)
      fail(str_cat("expected '%}' to end the '", tag, "' tag, found ", describe(cur())));
    ++pos_;
  }

  // Bounds recursion so that hostile nesting fails cleanly instead of overflowing the stack.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail(str_cat("nesting deeper than ", kMaxNesting, " levels"));
    }
    ~DepthGuard() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 200;

  template <typename T>
  std::unique_ptr<T> node() {
    auto n = std::make_unique<T>();
    n->line = line();
    return n;
  }

  // Statements until one of the stop tags; *found names it (the tag's name token is consumed).
  Body parse_body(const std::set<std::string>& stops, std::string& found) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!stops.empty()) fail(str_cat("unexpected end of template, expected '", *stops.rbegin(), "'"));
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = node<TextStmt>();
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.type == Tok::VarBegin) {
        ++pos_;
        auto s = node<EmitStmt>();
        s->expr = parse_tuple_or_expr();
        if (cur().type != Tok::VarEnd) fail(str_cat("expected '}}', found ", describe(cur())));
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        ++pos_;
        if (cur().type == Tok::Name && stops.count(cur().text)) {
          found = toks_[pos_++].text;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    int tag_line = line();
    std::string tag = expect_name("a tag name");
    StmtPtr s;
    if (tag == "if") s = parse_if();
    else if (tag == "for") s = parse_for();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(str_cat("'", tag, "' outside of a for loop"));
      auto n = std::make_unique<LoopControlStmt>();
      n->flow = tag == "break" ? Flow::Break : Flow::Continue;
      expect_block_end(tag.c_str());
      s = std::move(n);
    } else if (tag == "generation") {
      auto n = std::make_unique<BlockStmt>();
      expect_block_end("generation");
      std::string found;
      n->body = parse_body({"endgeneration"}, found);
      expect_block_end("endgeneration");
      s = std::move(n);
    } else {
      --pos_;
      fail(str_cat("unknown or unsupported tag '", tag, "'"));
    }
    s->line = tag_line;
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>();
    ExprPtr cond = parse_expr();
    expect_block_end("if");
    while (true) {
      std::string found;
      Body body = parse_body({"elif", "else", "endif"}, found);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (found == "elif") {
        cond = parse_expr();
        expect_block_end("elif");
        continue;
      }
      if (found == "else") {
        expect_block_end("else");
        s->otherwise = parse_body({"endif"}, found);
      }
      expect_block_end("endif");
      return s;
    }
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>();
    bool paren = skip_op("(");
    do {
      s->targets.push_back(expect_name("a loop variable"));
    } while (skip_op(","));
    if (paren) expect_op(")");
    if (!skip_name("in")) fail(str_cat("expected 'in' in the for tag, found ", describe(cur())));
    s->iterable = parse_tuple_or_expr(false);
    if (skip_name("if")) s->filter = parse_expr();
    if (is_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end("for");
    ++loop_depth_;
    std::string found;
    s->body = parse_body({"else", "endfor"}, found);
    --loop_depth_;
    if (found == "else") {
      expect_block_end("else");
      s->otherwise = parse_body({"endfor"}, found);
    }
    expect_block_end("endfor");
    return s;
  }

  StmtPtr parse_set() {
    std::vector<std::string> targets{expect_name("a variable name")};
    std::string attribute;
    if (skip_op(".")) {
      attribute = expect_name("an attribute name");
    } else {
      while (skip_op(",")) targets.push_back(expect_name("a variable name"));
    }
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>();
      s->targets = std::move(targets);
      s->attribute = attribute;
      s->value = parse_tuple_or_expr();
      expect_block_end("set");
      return s;
    }
    if (targets.size() != 1 || !attribute.empty()) fail("a block set takes exactly one variable name");
    auto s = std::make_unique<SetBlockStmt>();
    s->target = targets[0];
    while (skip_op("|")) {
      std::string name = expect_name("a filter name");
      Args args;
      if (is_op("(")) args = parse_call_args();
      s->filters.emplace_back(name, std::move(args));
    }
    expect_block_end("set");
    std::string found;
    s->body = parse_body({"endset"}, found);
    expect_block_end("endset");
    return s;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>();
    s->name = expect_name("a macro name");
    expect_op("(");
    while (!skip_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string param = expect_name("a parameter name");
      ExprPtr def;
      if (skip_op("=")) def = parse_expr();
      s->params.emplace_back(param, std::move(def));
    }
    expect_block_end("macro");
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    s->body = parse_body({"endmacro"}, found);
    loop_depth_ = saved_loops;
    if (cur().type == Tok::Name) ++pos_;  // {% endmacro name %}
    expect_block_end("endmacro");
    return s;
  }

  // ---- expressions ----

  ExprPtr parse_tuple_or_expr(bool with_cond = true) {
    ExprPtr first = with_cond ? parse_expr() : parse_or();
    if (!is_op(",")) return first;
    auto list = node<ListExpr>();
    list->is_tuple = true;
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd) break;
      list->items.push_back(with_cond ? parse_expr() : parse_or());
    }
    return list;
  }

  ExprPtr parse_expr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      auto c = node<CondExpr>();
      ++pos_;
      c->then = std::move(expr);
      c->cond = parse_or();
      if (skip_name("else")) c->otherwise = parse_expr();
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int ln) {
    auto b = std::make_unique<BinaryExpr>();
    b->line = ln;
    b->op = op;
    b->left = std::move(left);
    b->right = std::move(right);
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int ln = line();
      ++pos_;
      left = binary("or", std::move(left), parse_and(), ln);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int ln = line();
      ++pos_;
      left = binary("and", std::move(left), parse_not(), ln);
    }
    return left;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto u = node<UnaryExpr>();
      ++pos_;
      u->op = "not";
      u->operand = parse_not();
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int ln = line();
    ExprPtr first = parse_math1();
    std::vector<std::pair<std::string, ExprPtr>> rest;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        pos_ += 2;
      } else {
        break;
      }
      rest.emplace_back(op, parse_math1());
    }
    if (rest.empty()) return first;
    auto c = std::make_unique<CompareExpr>();
    c->line = ln;
    c->first = std::move(first);
    c->rest = std::move(rest);
    return c;
  }

  template <typename Next>
  ExprPtr parse_binary_level(std::initializer_list<const char*> ops, Next next) {
    ExprPtr left = (this->*next)();
    while (cur().type == Tok::Op) {
      const char* match = nullptr;
      for (const char* op : ops)
        if (cur().text == op) match = op;
      if (!match) break;
      int ln = line();
      ++pos_;
      left = binary(match, std::move(left), (this->*next)(), ln);
    }
    return left;
  }

  ExprPtr parse_math1() { return parse_binary_level({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return parse_binary_level({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return parse_binary_level({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return parse_binary_level({"**"}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr expr;
    if (is_op("-") || is_op("+")) {
      auto u = node<UnaryExpr>();
      u->op = cur().text;
      ++pos_;
      u->operand = parse_unary(false);
      expr = std::move(u);
    } else {
      expr = parse_primary();
    }
    expr = parse_postfix(std::move(expr));
    if (with_filter) expr = parse_filters_and_tests(std::move(expr));
    return expr;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == Tok::Name) {
      ++pos_;
      auto lit = std::make_unique<Literal>();
      lit->line = lexer_.line_col(t.offset).first;
      if (t.text == "true" || t.text == "True") lit->value = true;
      else if (t.text == "false" || t.text == "False") lit->value = false;
      else if (t.text == "none" || t.text == "None") lit->value = None{};
      else {
        auto n = std::make_unique<NameExpr>();
        n->line = lit->line;
        n->name = t.text;
        return n;
      }
      return lit;
    }
    if (t.type == Tok::String) {
      auto lit = node<Literal>();
      std::string s;
      while (cur().type == Tok::String) s += toks_[pos_++].text;
      lit->value = std::move(s);
      return lit;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      auto lit = node<Literal>();
      lit->value = t.type == Tok::Int ? Value(t.int_value) : Value(t.float_value);
      ++pos_;
      return lit;
    }
    if (is_op("(")) {
      int ln = line();
      ++pos_;
      if (skip_op(")")) {
        auto list = std::make_unique<ListExpr>();
        list->line = ln;
        list->is_tuple = true;
        return list;
      }
      ExprPtr inner = parse_expr();
      if (is_op(",")) {
        auto list = std::make_unique<ListExpr>();
        list->line = ln;
        list->is_tuple = true;
        list->items.push_back(std::move(inner));
        while (skip_op(",") && !is_op(")")) list->items.push_back(parse_expr());
        inner = std::move(list);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      auto list = node<ListExpr>();
      ++pos_;
      while (!skip_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (skip_op("]")) break;
        list->items.push_back(parse_expr());
      }
      return list;
    }
    if (is_op("{")) {
      auto dict = node<DictExpr>();
      ++pos_;
      while (!skip_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (skip_op("}")) break;
        ExprPtr key = parse_expr();
        expect_op(":");
        dict->items.emplace_back(std::move(key), parse_expr());
      }
      return dict;
    }
    fail("expected an expression, found " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr expr) {
    while (true) {
      if (is_op(".")) {
        auto a = node<AttrExpr>();
        ++pos_;
        if (cur().type == Tok::Int) {  // x.0 is x[0]
          auto item = std::make_unique<ItemExpr>();
          item->line = a->line;
          auto idx = node<Literal>();
          idx->value = cur().int_value;
          ++pos_;
          item->object = std::move(expr);
          item->index = std::move(idx);
          expr = std::move(item);
          continue;
        }
        a->name = expect_name("an attribute name");
        a->object = std::move(expr);
        expr = std::move(a);
      } else if (is_op("[")) {
        int ln = line();
        ++pos_;
        ExprPtr start;
        if (!is_op(":")) start = parse_expr();
        if (skip_op("]")) {
          auto item = std::make_unique<ItemExpr>();
          item->line = ln;
          item->object = std::move(expr);
          item->index = std::move(start);
          expr = std::move(item);
          continue;
        }
        auto slice = std::make_unique<SliceExpr>();
        slice->line = ln;
        slice->object = std::move(expr);
        slice->start = std::move(start);
        expect_op(":");
        if (!is_op(":") && !is_op("]")) slice->stop = parse_expr();
        if (skip_op(":") && !is_op("]")) slice->step = parse_expr();
        expect_op("]");
        expr = std::move(slice);
      } else if (is_op("(")) {
        expr = make_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  ExprPtr make_call(ExprPtr callee) {
    auto c = node<CallExpr>();
    c->callee = std::move(callee);
    c->args = parse_call_args();
    return c;
  }

  Args parse_call_args() {
    Args args;
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string name = cur().text;
        pos_ += 2;
        args.keyword.emplace_back(name, parse_expr());
      } else {
        if (!args.keyword.empty()) fail("positional argument after a keyword argument");
        args.positional.push_back(parse_expr());
      }
    }
    return args;
  }

  ExprPtr parse_filters_and_tests(ExprPtr expr) {
    while (true) {
      if (is_op("|")) {
        auto f = node<FilterExpr>();
        ++pos_;
        f->name = expect_name("a filter name");
        if (is_op("(")) f->args = parse_call_args();
        f->operand = std::move(expr);
        expr = std::move(f);
      } else if (is_name("is")) {
        auto t = node<TestExpr>();
        ++pos_;
        t->negated = skip_name("not");
        t->name = expect_name("a test name");
        if (is_op("(")) {
          t->args = parse_call_args();
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        t->operand = std::move(expr);
        expr = std::move(t);
      } else if (is_op("(")) {
        expr = make_call(std::move(expr));
      } else {
        return expr;
      }
    }
  }

  const Lexer& lexer_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace
}  // namespace detail

Template Template::parse(std::string_view source) {
  if (source.size() > kMaxTemplateBytes)
    throw TemplateError(str_cat("chat template is ", source.size(), " bytes, more than the limit of ",
                                kMaxTemplateBytes));
  detail::Lexer lexer(source);
  detail::Parser parser(lexer, lexer.run());
  auto impl = std::make_shared<Impl>();
  impl->body = parser.parse_template();
  Template t;
  t.impl_ = std::move(impl);
  return t;
}

}  // namespace minfer::jinja
