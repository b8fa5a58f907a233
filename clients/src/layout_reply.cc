#include "layout_reply.h"

#include <cstring>
#include <string_view>

namespace spillfs::client {
namespace {

// JSON's one-letter escapes, and the characters they stand for.
constexpr std::string_view kEscapes = "\"\\/bfnrt";
constexpr std::string_view kEscaped = "\"\\/\b\f\n\r\t";

class Reader {
 public:
  explicit Reader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool ok() const { return ok_; }
  bool AtEnd() {
    Ws();
    return p_ == end_;
  }
  void Ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool Peek(char c) {
    Ws();
    return p_ < end_ && *p_ == c;
  }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++p_;
    return true;
  }
  bool Expect(char c) {
    if (!Eat(c)) ok_ = false;
    return ok_;
  }

  bool String(std::string* out) {
    if (!Expect('"')) return false;
    out->clear();
    while (p_ < end_ && *p_ != '"') {
      if (*p_ == '\\') {
        if (++p_ >= end_) return Bad();
        const size_t simple = kEscapes.find(*p_);
        if (simple != std::string_view::npos) {
          out->push_back(kEscaped[simple]);
          ++p_;
          continue;
        }
        if (*p_ != 'u') return Bad();
        if (end_ - p_ < 5) return Bad();
        unsigned cp = 0;
        for (int i = 1; i <= 4; ++i) {
          char h = p_[i];
          cp <<= 4;
          if (h >= '0' && h <= '9')
            cp |= static_cast<unsigned>(h - '0');
          else if (h >= 'a' && h <= 'f')
            cp |= static_cast<unsigned>(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F')
            cp |= static_cast<unsigned>(h - 'A' + 10);
          else
            return Bad();
        }
        p_ += 4;
        if (cp >= 0xd800 && cp < 0xe000) return Bad();  // surrogates: leave to the full parser
        if (cp < 0x80) {
          out->push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
          out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
          out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        } else {
          out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
          out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
          out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        }
        ++p_;
      } else {
        out->push_back(*p_++);
      }
    }
    if (p_ >= end_) return Bad();
    ++p_;
    return true;
  }

  bool Uint(uint64_t* out) {
    Ws();
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return Bad();
    uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      uint64_t d = static_cast<uint64_t>(*p_ - '0');
      if (v > (UINT64_MAX - d) / 10) return Bad();
      v = v * 10 + d;
      ++p_;
    }
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return Bad();
    *out = v;
    return true;
  }

  bool Bool(bool* out) {
    Ws();
    if (end_ - p_ >= 4 && std::memcmp(p_, "true", 4) == 0) {
      p_ += 4;
      *out = true;
      return true;
    }
    if (end_ - p_ >= 5 && std::memcmp(p_, "false", 5) == 0) {
      p_ += 5;
      *out = false;
      return true;
    }
    return Bad();
  }

  // Skips any value.
  bool Skip(int depth = 0) {
    if (depth > 64) return Bad();
    Ws();
    if (p_ >= end_) return Bad();
    char c = *p_;
    if (c == '"') {
      std::string s;
      return String(&s);
    }
    if (c == '{') {
      ++p_;
      if (Eat('}')) return true;
      do {
        std::string k;
        if (!String(&k) || !Expect(':') || !Skip(depth + 1)) return false;
      } while (Eat(','));
      return Expect('}');
    }
    if (c == '[') {
      ++p_;
      if (Eat(']')) return true;
      do {
        if (!Skip(depth + 1)) return false;
      } while (Eat(','));
      return Expect(']');
    }
    if (c == 't' || c == 'f') {
      bool b;
      return Bool(&b);
    }
    if (end_ - p_ >= 4 && std::memcmp(p_, "null", 4) == 0) {
      p_ += 4;
      return true;
    }
    // A number of any form.
    const char* start = p_;
    while (p_ < end_ && (std::strchr("+-0123456789.eE", *p_) != nullptr)) ++p_;
    return p_ > start ? true : Bad();
  }

  // {"k": v, ...}: calls f(key) positioned at each value; f consumes it.
  template <typename F>
  bool Object(F&& f) {
    if (!Expect('{')) return false;
    if (Eat('}')) return true;
    std::string key;
    do {
      if (!String(&key) || !Expect(':')) return false;
      if (!f(key)) return Bad();
    } while (Eat(','));
    return Expect('}');
  }

  template <typename F>
  bool Array(F&& f) {
    if (!Expect('[')) return false;
    if (Eat(']')) return true;
    do {
      if (!f()) return Bad();
    } while (Eat(','));
    return Expect(']');
  }

 private:
  bool Bad() {
    ok_ = false;
    return false;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

bool ReadExtent(Reader& r, LayoutExtent* x) {
  return r.Object([&](const std::string& key) {
    if (key == "file_offset") return x->has_file_offset = r.Uint(&x->file_offset);
    if (key == "physical_offset") return x->has_physical_offset = r.Uint(&x->physical_offset);
    if (key == "length") return x->has_length = r.Uint(&x->length);
    if (key == "unwritten") return r.Bool(&x->unwritten);
    if (key == "block_checksums") {
      return r.Array([&] {
        uint64_t v;
        if (!r.Uint(&v) || v > UINT32_MAX) return false;
        x->block_checksums.push_back(static_cast<uint32_t>(v));
        return true;
      });
    }
    return r.Skip();
  });
}

bool ReadLayout(Reader& r, LayoutReply* out) {
  return r.Object([&](const std::string& key) {
    if (key == "ino") return r.Uint(&out->ino);
    if (key == "size") return out->has_size = r.Uint(&out->size);
    if (key == "block_size") return out->has_block_size = r.Uint(&out->block_size);
    if (key == "data_path") return out->has_data_path = r.String(&out->data_path);
    if (key == "checksums") return r.Bool(&out->checksums);
    if (key == "extents") {
      out->has_extents = true;
      return r.Array([&] {
        out->extents.emplace_back();
        return ReadExtent(r, &out->extents.back());
      });
    }
    return r.Skip();
  });
}

}  // namespace

bool ParseLayoutReply(std::string_view text, LayoutReply* out) {
  Reader r(text);
  bool ok_true = false, have_result = false;
  bool parsed = r.Object([&](const std::string& key) {
    if (key == "ok") return r.Bool(&ok_true);
    if (key == "result") {
      have_result = true;
      return ReadLayout(r, out);
    }
    return r.Skip();
  });
  return parsed && r.ok() && r.AtEnd() && ok_true && have_result;
}

}  // namespace spillfs::client
