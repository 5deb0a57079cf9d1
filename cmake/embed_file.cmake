# cmake -DIN=FILE -DOUT=SOURCE -DFUNCTION=NAME -P embed_file.cmake: writes a C++ source whose
# minfer::server::NAME() returns FILE's bytes as a std::string_view.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}.tmp"
  "// Generated from ${IN} by cmake/embed_file.cmake; do not edit.\n"
  "#include <string_view>\n"
  "namespace minfer::server {\n"
  "namespace {\nconst unsigned char kBytes[] = {${bytes}};\n}  // namespace\n"
  "std::string_view ${FUNCTION}() { return {reinterpret_cast<const char*>(kBytes), sizeof kBytes}; }\n"
  "}  // namespace minfer::server\n")
file(RENAME "${OUT}.tmp" "${OUT}")
