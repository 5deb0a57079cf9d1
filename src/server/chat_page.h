// The chat page served at GET /: src/server/chat_page.html, embedded by the build (CMake writes
// its bytes into a generated source file; there is no other build step).
#pragma once
#include <string_view>

namespace minfer::server {

std::string_view chat_page_html();

}  // namespace minfer::server
