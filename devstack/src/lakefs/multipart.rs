//! The upload body: `multipart/form-data` with a part named `content` (what `lakefs-sdk`
//! sends), or the raw object bytes with the object's own content type (the `lakefs` package
//! and plain HTTP clients).

use axum::body::Bytes;

use super::error::LakefsError;

/// The stored content type of an upload without one.
pub(crate) const OCTET_STREAM: &str = "application/octet-stream";

/// The object bytes and content type of an upload request.
pub(crate) fn object_body(
    content_type: Option<&str>,
    body: Bytes,
) -> Result<(String, Bytes), LakefsError> {
    let Some(content_type) = content_type.filter(|c| !c.trim().is_empty()) else {
        return Ok((OCTET_STREAM.to_owned(), body));
    };
    let mut params = content_type.split(';');
    let media_type = params.next().unwrap_or_default().trim();
    if !media_type.eq_ignore_ascii_case("multipart/form-data") {
        // Stored exactly as sent, parameters included, as the real server does.
        return Ok((content_type.to_owned(), body));
    }
    let boundary = params
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| LakefsError::Internal("multipart: boundary missing".to_owned()))?;
    content_part(&body, &boundary)
}

/// Finds the first part named `content`; the real server answers 500 without one.
fn content_part(body: &Bytes, boundary: &str) -> Result<(String, Bytes), LakefsError> {
    let missing = || {
        LakefsError::Internal(
            "multipart upload missing key 'content': http: no such file".to_owned(),
        )
    };
    let delimiter = format!("--{boundary}");
    let mut rest = match find(body, delimiter.as_bytes(), 0) {
        Some(at) => at + delimiter.len(),
        None => return Err(missing()),
    };
    let next_delimiter = format!("\r\n--{boundary}");
    loop {
        // After a delimiter: `--` ends the body, otherwise CRLF and the part's headers.
        if body[rest..].starts_with(b"--") {
            return Err(missing());
        }
        let headers_start = find(body, b"\r\n", rest).ok_or_else(missing)? + 2;
        let headers_end = find(body, b"\r\n\r\n", headers_start - 2).ok_or_else(missing)?;
        // A part without headers ends its (empty) header block right at `headers_start - 2`.
        let headers =
            String::from_utf8_lossy(body.get(headers_start..headers_end).unwrap_or_default());
        let data_start = headers_end + 4;
        let data_end = find(body, next_delimiter.as_bytes(), data_start).ok_or_else(missing)?;
        let (name, content_type) = part_headers(&headers);
        if name.as_deref() == Some("content") {
            let content_type = content_type.unwrap_or_else(|| OCTET_STREAM.to_owned());
            return Ok((content_type, body.slice(data_start..data_end)));
        }
        rest = data_end + next_delimiter.len();
    }
}

/// The form name and content type of a part.
fn part_headers(headers: &str) -> (Option<String>, Option<String>) {
    let mut name = None;
    let mut content_type = None;
    for line in headers.split("\r\n") {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("content-disposition") {
            name = value
                .split(';')
                .filter_map(|p| p.split_once('='))
                .find_map(|(k, v)| {
                    (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
                });
        } else if key.trim().eq_ignore_ascii_case("content-type") {
            content_type = Some(value.trim().to_owned());
        }
    }
    (name, content_type)
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > haystack.len() {
        return None;
    }
    haystack[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_content_part_of_a_multipart_body() {
        let body = "--b1\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n\
                    --b1\r\nContent-Disposition: form-data; name=\"content\"; filename=\"content_0\"\r\n\
                    Content-Type: text/csv\r\n\r\na,b\r\n1,2\r\n--b1--\r\n";
        let (ct, data) =
            object_body(Some("multipart/form-data; boundary=b1"), Bytes::from(body)).unwrap();
        assert_eq!(ct, "text/csv");
        assert_eq!(&data[..], b"a,b\r\n1,2");
    }

    #[test]
    fn raw_bodies_keep_their_content_type_and_bad_multipart_is_a_500() {
        let (ct, data) =
            object_body(Some("application/json; charset=utf-8"), Bytes::from("{}")).unwrap();
        assert_eq!(
            (ct.as_str(), &data[..]),
            ("application/json; charset=utf-8", &b"{}"[..])
        );
        assert_eq!(object_body(None, Bytes::new()).unwrap().0, OCTET_STREAM);
        let no_content = "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--\r\n";
        let err = object_body(
            Some("multipart/form-data; boundary=b"),
            Bytes::from(no_content),
        )
        .unwrap_err();
        assert_eq!(err.status().as_u16(), 500);
        assert!(object_body(Some("multipart/form-data"), Bytes::new()).is_err());
        let headerless = "--b\r\n\r\nx\r\n--b--\r\n";
        let err = object_body(
            Some("multipart/form-data; boundary=b"),
            Bytes::from(headerless),
        );
        assert_eq!(err.unwrap_err().status().as_u16(), 500);
        for cut in [
            "--b",
            "--b\r\n",
            "--b\r\nA: b",
            "--b\r\nContent-Disposition: form-data; name=content\r\n\r\nx",
        ] {
            let err = object_body(Some("multipart/form-data; boundary=b"), Bytes::from(cut));
            assert!(err.is_err(), "{cut:?}");
        }
        assert!(
            object_body(
                Some("multipart/form-data; boundary=b"),
                Bytes::from("garbage")
            )
            .is_err()
        );
    }

    #[test]
    fn truncated_or_damaged_bodies_never_panic() {
        let body = "--b\r\nContent-Disposition: form-data; name=\"content\"\r\n\
                    Content-Type: text/plain\r\n\r\nxy\r\n--b--\r\n";
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len() {
            let truncated = Bytes::copy_from_slice(&bytes[..cut]);
            let _ = object_body(Some("multipart/form-data; boundary=b"), truncated);
            let mut damaged = bytes.to_vec();
            damaged.remove(cut.min(bytes.len() - 1));
            let _ = object_body(
                Some("multipart/form-data; boundary=b"),
                Bytes::from(damaged),
            );
        }
    }
}
