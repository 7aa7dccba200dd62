#include "client/spec_overrides.h"

#include <toml++/toml.h>

#include <optional>
#include <sstream>

#include "spec/toml_text.h"

namespace strata::client {
namespace {

// The value as TOML reads it (the table holds it as "v"), or nothing when it is no TOML value (a
// bare word, a path).
std::optional<toml::table> AsToml(const std::string& text) {
  if (!CheckTomlText(text, "").ok()) return std::nullopt;  // a string then (spec/toml_text.h)
  try {
    toml::table t = toml::parse("v = " + text);
    if (t.get("v")) return t;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

const char* TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "true or false";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a value";
  }
}

}  // namespace

Result<std::string> ApplySpecOverrides(const std::string& toml_text, const std::vector<std::string>& overrides) {
  STRATA_RETURN_IF_ERROR(CheckTomlText(toml_text, "run spec"));
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& e) {
    return InvalidArgument("run spec is not valid TOML: " + std::string(e.description()));
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    const std::string key = o.substr(0, eq);
    if (eq == std::string::npos || key.empty()) {
      return InvalidArgument("--set " + o + ": expected KEY=VALUE, e.g. --set train.steps=10");
    }
    const std::string value = o.substr(eq + 1);
    // Walk (and make) the tables of the path.
    std::vector<std::string> parts;
    for (size_t begin = 0;;) {
      const size_t dot = key.find('.', begin);
      parts.push_back(key.substr(begin, dot - begin));
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
    toml::table* table = &root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].empty()) return InvalidArgument("--set " + o + ": '" + key + "' has an empty part");
      toml::node* next = table->get(parts[i]);
      if (!next) next = table->insert(parts[i], toml::table{}).first->second.as_table();
      if (!next->is_table()) {
        return InvalidArgument("--set " + o + ": '" + parts[i] + "' in the spec is " + TypeName(next->type()) +
                               ", not a table with keys");
      }
      table = next->as_table();
    }
    const std::string& leaf = parts.back();
    if (leaf.empty()) return InvalidArgument("--set " + o + ": '" + key + "' has an empty part");
    std::optional<toml::table> holder = AsToml(value);
    toml::node* parsed = holder ? holder->get("v") : nullptr;
    const toml::node* existing = table->get(leaf);
    if (existing && existing->type() == toml::node_type::string) {
      table->insert_or_assign(leaf, value);  // a string key takes the text as it is
      continue;
    }
    if (existing && (!parsed || parsed->type() != existing->type())) {
      // An integer key given a whole number written as a float, or the reverse, is still refused:
      // the parser would refuse it too, with less to go on.
      const bool widen = parsed && existing->is_floating_point() && parsed->is_integer();
      if (!widen) {
        return InvalidArgument("--set " + o + ": " + key + " is " + TypeName(existing->type()) + " in the spec; give " +
                               TypeName(existing->type()) + " (it reads '" + value + "' as " +
                               (parsed ? TypeName(parsed->type()) : "text") + ")");
      }
      table->insert_or_assign(leaf, static_cast<double>(parsed->as_integer()->get()));
      continue;
    }
    if (parsed) {
      parsed->visit([&](auto& n) { table->insert_or_assign(leaf, std::move(n)); });
    } else {
      table->insert_or_assign(leaf, value);
    }
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace strata::client
