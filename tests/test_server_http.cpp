// The HTTP server before the model is ready: it listens at once, /health says 503 "loading",
// model routes answer 503 in OpenAI's error shape, the chat page and the 404 shape need no model.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "server/http_server.h"

namespace minfer::server {
namespace {

TEST(HttpServer, AnswersWhileTheModelLoads) {
  ServerMetrics metrics;
  HttpOptions opts;
  opts.port = 0;
  opts.threads = 4;
  HttpServer http(opts, metrics);
  const int port = http.bind();
  ASSERT_GT(port, 0);
  std::thread serving([&] { http.serve(); });
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);

  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(Json::parse(health->body)["status"], "loading");
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 503);
  EXPECT_EQ(Json::parse(models->body)["error"]["code"], "loading");
  auto chat = client.Post("/v1/chat/completions", R"({"messages":[]})", "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 503);
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<title>minfer chat</title>"), std::string::npos);
  auto missing = client.Get("/nowhere");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(Json::parse(missing->body)["error"]["type"], "not_found_error");

  http.stop();
  serving.join();
}

}  // namespace
}  // namespace minfer::server
