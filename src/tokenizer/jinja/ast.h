// The parsed template: expression and statement nodes (built by parser.cpp, run by eval.cpp).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja/jinja.h"

namespace minfer::jinja::detail {

// A variable scope: the template's top level, one for-loop iteration, one macro call.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const;
};
using FramePtr = std::shared_ptr<Frame>;

struct Runtime {
  int macro_depth = 0;
  // namespace() objects are the one mutable value, so the only way to build a reference cycle
  // (ns.self = ns): emptied when the render ends, so that the cycle's memory is freed.
  std::vector<std::weak_ptr<Object>> namespaces;
  ~Runtime();
};

[[noreturn]] void runtime_fail(int line, const std::string& message);

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Runtime& rt, const FramePtr& frame) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Literal : Expr {
  Value value;
  Value eval(Runtime&, const FramePtr&) const override { return value; }
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct NameExpr : Expr {
  std::string name;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct AttrExpr : Expr {  // obj.name
  ExprPtr object;
  std::string name;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct ItemExpr : Expr {  // obj[index]
  ExprPtr object, index;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct SliceExpr : Expr {  // obj[start:stop:step], each part optional
  ExprPtr object, start, stop, step;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct Args {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  CallArgs eval(Runtime& rt, const FramePtr& frame) const;
};
struct CallExpr : Expr {
  ExprPtr callee;
  Args args;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct FilterExpr : Expr {  // operand | name(args)
  ExprPtr operand;
  std::string name;
  Args args;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct TestExpr : Expr {  // operand is [not] name(args)
  ExprPtr operand;
  std::string name;
  Args args;
  bool negated = false;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct UnaryExpr : Expr {  // - + not
  std::string op;
  ExprPtr operand;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct BinaryExpr : Expr {  // arithmetic, ~, and, or
  std::string op;
  ExprPtr left, right;
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct CompareExpr : Expr {  // a < b <= c ... (chained like Python)
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // ops: == != < > <= >= in notin
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};
struct CondExpr : Expr {  // then if cond else otherwise
  ExprPtr then, cond, otherwise;  // otherwise may be null: undefined
  Value eval(Runtime& rt, const FramePtr& frame) const override;
};

enum class Flow { Normal, Break, Continue };

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
Flow exec_body(const Body& body, Runtime& rt, const FramePtr& frame, std::string& out);

struct TextStmt : Stmt {
  std::string text;
  Flow exec(Runtime&, const FramePtr&, std::string& out) const override {
    out += text;
    return Flow::Normal;
  }
};
struct EmitStmt : Stmt {  // {{ expr }}
  ExprPtr expr;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if + elifs
  Body otherwise;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct ForStmt : Stmt {
  std::vector<std::string> targets;  // one name, or several to unpack
  ExprPtr iterable, filter;          // filter: the inline "if", may be null
  Body body, otherwise;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct SetStmt : Stmt {
  std::vector<std::string> targets;  // names; or {namespace, attribute} when attribute set
  std::string attribute;
  ExprPtr value;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct SetBlockStmt : Stmt {  // {% set name | filters %}body{% endset %}
  std::string target;
  Body body;
  std::vector<std::pair<std::string, Args>> filters;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct MacroStmt : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override;
};
struct LoopControlStmt : Stmt {
  Flow flow = Flow::Break;
  Flow exec(Runtime&, const FramePtr&, std::string&) const override { return flow; }
};
struct BlockStmt : Stmt {  // {% generation %}: output passes through
  Body body;
  Flow exec(Runtime& rt, const FramePtr& frame, std::string& out) const override {
    return exec_body(body, rt, frame, out);
  }
};

// Filters, tests and globals (eval.cpp).
Value apply_filter(const std::string& name, const Value& operand, CallArgs& args, Runtime& rt, int line);
FramePtr make_globals(Runtime& rt);

}  // namespace minfer::jinja::detail

struct minfer::jinja::Template::Impl {
  detail::Body body;
};
