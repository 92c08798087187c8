//! HTML to text: tags stripped, scripts, styles and comments dropped, entities decoded.
//!
//! Web pages are fingerprinted on their visible text, so markup must not become features and
//! two copies of a page that differ only in markup must give the same text. This is a single
//! forward scan, not an HTML parser: it does not build a tree, fix nesting or apply CSS.
//! What it does:
//!
//! * `<script>`, `<style>`, `<template>` and `<noscript>` elements are dropped with their
//!   content; so are comments (`<!-- -->`), `<!DOCTYPE>`, CDATA and processing instructions;
//! * every other tag is removed; a tag that is not an inline element (`<p>`, `<div>`,
//!   `<br>`, `<li>`, `<td>`...) becomes a space so that the words on both sides stay apart,
//!   while inline ones (`<b>`, `<a>`, `<span>`...) join their neighbours as a browser shows
//!   them;
//! * character references are decoded: numeric (`&#233;`, `&#xE9;`) and the named entities
//!   of Latin-1 plus the common typographic ones (`&amp;`, `&nbsp;`, `&mdash;`, `&euro;`,
//!   ...); an unknown name is kept as it is written;
//! * a `<` that does not start a tag stays text.
//!
//! It also finds the encoding a page declares ([`declared_encoding`]), which must be known
//! before the page can be read as text at all.

/// Whether `bytes` look like an HTML document: after leading whitespace (and a UTF-8 byte
/// order mark) they start with `<!doctype html`, `<html`, `<head`, `<body` or `<!--`.
pub fn looks_like_html(bytes: &[u8]) -> bool {
    let b = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let head = &b[start..b.len().min(start + 16)];
    let lower: Vec<u8> = head.iter().map(u8::to_ascii_lowercase).collect();
    [&b"<!doctype html"[..], b"<html", b"<head", b"<body", b"<!--"]
        .iter()
        .any(|p| lower.starts_with(p))
}

/// The visible text of `html`, appended to `out` (see the module documentation).
pub fn strip_html(html: &str, out: &mut String) {
    let b = html.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let Some(off) = memchr::memchr2(b'<', b'&', &b[i..]) else {
            out.push_str(&html[i..]);
            return;
        };
        out.push_str(&html[i..i + off]);
        i += off;
        if b[i] == b'&' {
            i = entity(html, i, out);
        } else {
            i = tag(html, i, out);
        }
    }
}

/// Handles the `<` at `i`; returns where text resumes.
fn tag(html: &str, i: usize, out: &mut String) -> usize {
    let b = html.as_bytes();
    let rest = &b[i..];
    if rest.starts_with(b"<!--") {
        return find(b, i + 4, b"-->").map_or(b.len(), |e| e + 3);
    }
    if rest.starts_with(b"<![CDATA[") {
        return find(b, i + 9, b"]]>").map_or(b.len(), |e| e + 3);
    }
    if rest.starts_with(b"<!") || rest.starts_with(b"<?") {
        out.push(' ');
        return memchr::memchr(b'>', &b[i..]).map_or(b.len(), |e| i + e + 1);
    }
    let closing = rest.get(1) == Some(&b'/');
    let name_start = i + 1 + closing as usize;
    let name_len = b[name_start..].iter().take_while(|c| c.is_ascii_alphanumeric()).count();
    if name_len == 0 || !b[name_start].is_ascii_alphabetic() {
        // Not a tag: a literal `<`.
        out.push('<');
        return i + 1;
    }
    let name = &b[name_start..name_start + name_len];
    let end = tag_end(b, name_start + name_len);
    let raw_text = ["script", "style", "template", "noscript", "textarea", "title"]
        .iter()
        .find(|n| name.eq_ignore_ascii_case(n.as_bytes()))
        .copied();
    match raw_text {
        // Text of a <title> or <textarea> is kept (it is text a reader sees); the others
        // are dropped. All of them end only at their closing tag.
        Some(n) if !closing && !matches!(n, "title" | "textarea") => {
            out.push(' ');
            skip_to_close(b, end, n.as_bytes())
        }
        _ => {
            if !is_inline(name) {
                out.push(' ');
            }
            end
        }
    }
}

/// The position after the `>` that ends a tag whose attributes start at `i`, skipping
/// quoted attribute values (which may contain `>`).
fn tag_end(b: &[u8], mut i: usize) -> usize {
    let mut quote = 0u8;
    while i < b.len() {
        let c = b[i];
        if quote != 0 {
            if c == quote {
                quote = 0;
            }
        } else if c == b'"' || c == b'\'' {
            quote = c;
        } else if c == b'>' {
            return i + 1;
        }
        i += 1;
    }
    b.len()
}

/// After the closing tag `</name ...>` found from `i` on (ASCII case-insensitive).
fn skip_to_close(b: &[u8], mut i: usize, name: &[u8]) -> usize {
    while let Some(off) = memchr::memchr(b'<', &b[i..]) {
        let at = i + off;
        let after = at + 2 + name.len();
        if b.get(at + 1) == Some(&b'/')
            && b.len() >= after
            && b[at + 2..after].eq_ignore_ascii_case(name)
            && b.get(after).is_none_or(|c| !c.is_ascii_alphanumeric())
        {
            return tag_end(b, after);
        }
        i = at + 1;
    }
    b.len()
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(&b[from..], needle).map(|p| from + p)
}

fn is_inline(name: &[u8]) -> bool {
    const INLINE: [&str; 24] = [
        "a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "font", "i", "kbd",
        "mark", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "u", "var",
    ];
    INLINE.iter().any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// Latin-1 names for U+00A0..=U+00FF, in code point order.
const LATIN1: [&str; 96] = [
    "nbsp", "iexcl", "cent", "pound", "curren", "yen", "brvbar", "sect", "uml", "copy", "ordf",
    "laquo", "not", "shy", "reg", "macr", "deg", "plusmn", "sup2", "sup3", "acute", "micro",
    "para", "middot", "cedil", "sup1", "ordm", "raquo", "frac14", "frac12", "frac34", "iquest",
    "Agrave", "Aacute", "Acirc", "Atilde", "Auml", "Aring", "AElig", "Ccedil", "Egrave", "Eacute",
    "Ecirc", "Euml", "Igrave", "Iacute", "Icirc", "Iuml", "ETH", "Ntilde", "Ograve", "Oacute",
    "Ocirc", "Otilde", "Ouml", "times", "Oslash", "Ugrave", "Uacute", "Ucirc", "Uuml", "Yacute",
    "THORN", "szlig", "agrave", "aacute", "acirc", "atilde", "auml", "aring", "aelig", "ccedil",
    "egrave", "eacute", "ecirc", "euml", "igrave", "iacute", "icirc", "iuml", "eth", "ntilde",
    "ograve", "oacute", "ocirc", "otilde", "ouml", "divide", "oslash", "ugrave", "uacute", "ucirc",
    "uuml", "yacute", "thorn", "yuml",
];

/// Other named references common on web pages.
const NAMED: [(&str, char); 36] = [
    ("amp", '&'),
    ("lt", '<'),
    ("gt", '>'),
    ("quot", '"'),
    ("apos", '\''),
    ("OElig", 'Œ'),
    ("oelig", 'œ'),
    ("Scaron", 'Š'),
    ("scaron", 'š'),
    ("Yuml", 'Ÿ'),
    ("fnof", 'ƒ'),
    ("circ", 'ˆ'),
    ("tilde", '˜'),
    ("ensp", '\u{2002}'),
    ("emsp", '\u{2003}'),
    ("thinsp", '\u{2009}'),
    ("zwnj", '\u{200C}'),
    ("zwj", '\u{200D}'),
    ("lrm", '\u{200E}'),
    ("rlm", '\u{200F}'),
    ("ndash", '–'),
    ("mdash", '—'),
    ("lsquo", '‘'),
    ("rsquo", '’'),
    ("sbquo", '‚'),
    ("ldquo", '“'),
    ("rdquo", '”'),
    ("bdquo", '„'),
    ("dagger", '†'),
    ("Dagger", '‡'),
    ("bull", '•'),
    ("hellip", '…'),
    ("permil", '‰'),
    ("lsaquo", '‹'),
    ("rsaquo", '›'),
    ("euro", '€'),
];

/// Handles the `&` at `i`; returns where text resumes.
fn entity(html: &str, i: usize, out: &mut String) -> usize {
    let b = html.as_bytes();
    let body_end = b[i + 1..].iter().take(34).position(|&c| c == b';').map(|p| i + 1 + p);
    let Some(semi) = body_end else {
        out.push('&');
        return i + 1;
    };
    let body = &html[i + 1..semi];
    let decoded = if let Some(num) = body.strip_prefix('#') {
        let value = match num.strip_prefix(['x', 'X']) {
            Some(hex) if !hex.is_empty() && hex.bytes().all(|c| c.is_ascii_hexdigit()) => {
                u32::from_str_radix(hex, 16).ok()
            }
            None if !num.is_empty() && num.bytes().all(|c| c.is_ascii_digit()) => num.parse().ok(),
            _ => None,
        };
        value.map(|v| match char::from_u32(v) {
            Some(c) if v != 0 => c,
            _ => char::REPLACEMENT_CHARACTER,
        })
    } else if let Some(p) = LATIN1.iter().position(|&n| n == body) {
        char::from_u32(0xA0 + p as u32)
    } else {
        NAMED.iter().find(|(n, _)| *n == body).map(|&(_, c)| c)
    };
    match decoded {
        Some(c) => {
            out.push(c);
            semi + 1
        }
        None => {
            out.push('&');
            i + 1
        }
    }
}

/// The encoding a page declares in its first 1024 bytes: `<meta charset=...>` or `<meta
/// http-equiv="Content-Type" content="...; charset=...">`, found as the HTML standard's
/// prescan finds it (comments and other tags' attributes skipped, the first usable
/// declaration wins; a declared UTF-16 means UTF-8 and `x-user-defined` windows-1252, as
/// the standard says, since a page that can be read this way is not UTF-16). `None` when
/// there is no declaration or its label is unknown.
pub(crate) fn declared_encoding(bytes: &[u8]) -> Option<&'static encoding_rs::Encoding> {
    let b = &bytes[..bytes.len().min(1024)];
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"<!--") {
            // The dashes of `<!--` may end it (`<!-->`), as the standard has it.
            i = find(b, i + 2, b"-->").map_or(b.len(), |e| e + 3);
            continue;
        }
        if rest.len() > 6
            && rest[..5].eq_ignore_ascii_case(b"<meta")
            && (rest[5].is_ascii_whitespace() || rest[5] == b'/')
        {
            let (found, end) = meta_charset(b, i + 5);
            if found.is_some() {
                return found;
            }
            i = end;
            continue;
        }
        let letter_at = |j: usize| b.get(j).is_some_and(u8::is_ascii_alphabetic);
        if rest.starts_with(b"<")
            && (letter_at(i + 1) || (rest.get(1) == Some(&b'/') && letter_at(i + 2)))
        {
            // Another tag: skip its name and attributes (a quoted `>` does not end it).
            let mut j = i + 1;
            while j < b.len() && !b[j].is_ascii_whitespace() && b[j] != b'>' {
                j += 1;
            }
            while let Some((_, _, next)) = attribute(b, j) {
                j = next;
            }
            i = j + 1;
            continue;
        }
        if rest.starts_with(b"<!") || rest.starts_with(b"</") || rest.starts_with(b"<?") {
            i = memchr::memchr(b'>', rest).map_or(b.len(), |e| i + e + 1);
            continue;
        }
        i += 1;
    }
    None
}

/// The charset of the `<meta` element whose attributes start at `i`, and where it ends.
fn meta_charset(b: &[u8], mut i: usize) -> (Option<&'static encoding_rs::Encoding>, usize) {
    let mut got_pragma = false;
    let mut need_pragma = None;
    let mut charset = None;
    let mut seen: Vec<Vec<u8>> = Vec::new();
    while let Some((name, value, next)) = attribute(b, i) {
        i = next;
        if seen.contains(&name) {
            continue;
        }
        match name.as_slice() {
            b"http-equiv" => got_pragma |= value.eq_ignore_ascii_case(b"content-type"),
            b"content" if charset.is_none() => {
                if let Some(label) = charset_in_content(&value) {
                    charset = encoding_rs::Encoding::for_label(label);
                    need_pragma = Some(true);
                }
            }
            b"charset" => {
                charset = encoding_rs::Encoding::for_label(&value);
                need_pragma = Some(false);
            }
            _ => {}
        }
        seen.push(name);
    }
    let found = match (need_pragma, charset) {
        (Some(true), _) if !got_pragma => None,
        (Some(_), Some(c)) => Some(if c == encoding_rs::UTF_16BE || c == encoding_rs::UTF_16LE {
            encoding_rs::UTF_8
        } else if c == encoding_rs::X_USER_DEFINED {
            encoding_rs::WINDOWS_1252
        } else {
            c
        }),
        _ => None,
    };
    (found, i)
}

/// The standard's "get an attribute": from `i`, the next attribute's lower-cased name, its
/// value and the position after it; `None` at the `>` that ends the tag or at the end.
fn attribute(b: &[u8], mut i: usize) -> Option<(Vec<u8>, Vec<u8>, usize)> {
    while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
        i += 1;
    }
    if i >= b.len() || b[i] == b'>' {
        return None;
    }
    let mut name = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c == b'=' && !name.is_empty() {
            break;
        }
        if c.is_ascii_whitespace() || c == b'/' || c == b'>' {
            break;
        }
        name.push(c.to_ascii_lowercase());
        i += 1;
    }
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if b.get(i) != Some(&b'=') {
        return Some((name, Vec::new(), i));
    }
    i += 1;
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let mut value = Vec::new();
    match b.get(i) {
        Some(&q @ (b'"' | b'\'')) => {
            let end = memchr::memchr(q, &b[i + 1..]).map_or(b.len(), |e| i + 1 + e);
            value.extend(b[i + 1..end].iter().map(u8::to_ascii_lowercase));
            i = end + 1;
        }
        _ => {
            while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'>' {
                value.push(b[i].to_ascii_lowercase());
                i += 1;
            }
        }
    }
    Some((name, value, i.min(b.len())))
}

/// The standard's "extract a character encoding from a meta element": the label after
/// `charset=` in a `content` value (already lower-cased).
fn charset_in_content(content: &[u8]) -> Option<&[u8]> {
    let mut from = 0;
    loop {
        let at = from + memchr::memmem::find(&content[from..], b"charset")?;
        let mut i = at + 7;
        while content.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if content.get(i) != Some(&b'=') {
            from = at + 7;
            continue;
        }
        i += 1;
        while content.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let rest = &content[i..];
        return match rest.first() {
            Some(&q @ (b'"' | b'\'')) => {
                let end = memchr::memchr(q, &rest[1..])?;
                Some(&rest[1..1 + end])
            }
            Some(_) => {
                let end = rest
                    .iter()
                    .position(|c| c.is_ascii_whitespace() || *c == b';')
                    .unwrap_or(rest.len());
                Some(&rest[..end])
            }
            None => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> String {
        let mut out = String::new();
        strip_html(s, &mut out);
        out.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn tags_scripts_styles_comments() {
        let page = "<!DOCTYPE html><html><head><title>The Title</title>\
            <style>body { color: red }</style><script type=\"x\">var a = '<p>no</p>';</script>\
            </head><body><!-- hidden <b>text</b> --><p>Hello <b>wor</b>ld</p><div>next</div>\
            <a href=\"x>y\">link</a><br/>end<SCRIPT>x()</SCRIPT >after</body></html>";
        assert_eq!(strip(page), "The Title Hello world next link end after");
    }

    #[test]
    fn entities() {
        assert_eq!(
            strip("caf&eacute; &amp; cr&#232;me &#xE9;t&#xe9; &mdash; a&nbsp;b &unknown; &amp"),
            "café & crème été — a b &unknown; &amp"
        );
        let mut raw = String::new();
        strip_html("a&nbsp;b", &mut raw);
        assert_eq!(raw, "a\u{a0}b");
        assert_eq!(strip("&#0; &#xD800; &#99999999999;"), "\u{fffd} \u{fffd} &#99999999999;");
        assert_eq!(strip("&szlig;&yuml;&iquest;&Agrave;&times;"), "ßÿ¿À×");
    }

    #[test]
    fn literal_angle_brackets_and_truncated_input() {
        assert_eq!(strip("1 < 2 and 3 <= 4, a<-b"), "1 < 2 and 3 <= 4, a<-b");
        assert_eq!(strip("text <p unterminated"), "text");
        assert_eq!(strip("x <script>never closed"), "x");
        assert_eq!(strip("x <!-- open comment"), "x");
        assert_eq!(strip("a &"), "a &");
    }

    #[test]
    fn never_panics_on_prefixes_of_markup() {
        let page = "<p a='>'>x&amp;y<scr<script>a</scr ipt></script ><!-- -- >--><![CDATA[z]]>é&#x";
        for end in (0..=page.len()).filter(|&e| page.is_char_boundary(e)) {
            strip(&page[..end]);
        }
    }

    #[test]
    fn declared_encodings() {
        let name = |page: &[u8]| declared_encoding(page).map(|e| e.name());
        assert_eq!(name(b"<meta charset=\"ISO-8859-1\">"), Some("windows-1252"));
        assert_eq!(name(b"<html><head><META CharSet=shift_jis>"), Some("Shift_JIS"));
        assert_eq!(name(b"<meta charset='utf-16le'>"), Some("UTF-8"));
        assert_eq!(name(b"<meta charset=x-user-defined>"), Some("windows-1252"));
        assert_eq!(
            name(b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1251\">"),
            Some("windows-1251")
        );
        assert_eq!(
            name(b"<meta content='text/html;charset=\"gbk\"' http-equiv=content-type>"),
            Some("GBK")
        );
        // content without http-equiv is not a declaration; an unknown label is none.
        assert_eq!(name(b"<meta content=\"text/html; charset=koi8-r\">"), None);
        assert_eq!(name(b"<meta charset=no-such-thing>"), None);
        // Comments and other tags' attributes are skipped; the first usable one wins.
        assert_eq!(name(b"<!-- <meta charset=big5> --><meta charset=euc-kr>"), Some("EUC-KR"));
        assert_eq!(name(b"<div title='<meta charset=big5>'><meta charset=koi8-r>"), Some("KOI8-R"));
        assert_eq!(name(b"<meta name=x><meta charset=big5><meta charset=koi8-r>"), Some("Big5"));
        // Only the first 1024 bytes count.
        let mut late = vec![b' '; 1024];
        late.extend_from_slice(b"<meta charset=big5>");
        assert_eq!(name(&late), None);
        // Cut anywhere, it does not panic.
        let cut = b"<meta http-equiv=content-type content='charset=\"x\"'>";
        for end in 0..=cut.len() {
            let _ = declared_encoding(&cut[..end]);
        }
    }

    #[test]
    fn sniffing() {
        assert!(looks_like_html(b"\xEF\xBB\xBF  <!DOCTYPE HTML>\n<html>"));
        assert!(looks_like_html(b"<html lang=en>"));
        assert!(!looks_like_html(b"plain text <html> later"));
        assert!(!looks_like_html(b""));
    }
}
